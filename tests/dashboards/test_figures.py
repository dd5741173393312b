"""Figure functions on a database filled by a real tiny sweep: points, traces, frontier, units, unavailable measures."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from sqlalchemy import create_engine, text

from analysis import names
from dashboards import cost_figures, figures, trace_figures
from dashboards.app import set_choices
from analysis.answer import answer
from analysis.points import accuracy_points, analytic_bytes
from dashboards.data import profile_points
from dashboards.report import build_report
from db import queries, sample_queries
from db.session import open_existing
import measures
from tests.support.frontier import brute_force_frontier

EVERY = 10**9  # a sample budget larger than any stratum: sample_spread then returns every matching sample


@pytest.fixture()
def engine(results_url: str):
    engine = open_existing(results_url)
    yield engine
    engine.dispose()


def _marker_points(fig: go.Figure) -> list[tuple[float, float]]:
    """(x, y) of every plotted marker (the frontier is a line-only trace, the shape key legend-only)."""
    return [
        (x, y)
        for trace in fig.data
        if "markers" in (trace.mode or "")
        for x, y in zip(trace.x, trace.y)
        if x is not None
    ]


def _model_traces(fig: go.Figure) -> list[go.Scatter]:
    """The traces of plotted points, one per model (the legend keys and the frontier carry no data)."""
    return [trace for trace in fig.data if trace.customdata is not None]


def _frontier(fig: go.Figure) -> go.Scatter:
    (front,) = [trace for trace in fig.data if trace.name.startswith("Pareto frontier")]
    return front


def _annotations(fig: go.Figure) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def _stored_peaks(url: str, measure: str) -> dict[tuple[str, int], float]:
    """(model, loops) -> stored peak, read with plain SQL rather than through db.queries."""
    with create_engine(url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.model_spec, COALESCE(r.loops, 1), p.value FROM runs r JOIN memory_peaks p ON p.run_id = r.id "
                "WHERE r.kind = 'eval' AND p.measure = :measure AND p.value IS NOT NULL"
            ),
            {"measure": measure},
        )
        return {(model, loops): value for model, loops, value in rows}


def test_accuracy_vs_memory_has_one_point_per_model_and_loops(engine, results_url: str) -> None:
    points = accuracy_points(engine, None)  # the latest set: the sweep's only one
    peaks = _stored_peaks(results_url, "kv_bytes_allocated")
    assert len(peaks) >= 4, "the sweep should give several (model, loops) pairs with accounted KV"

    fig = figures.accuracy_vs_memory(points, "kv_bytes_allocated")
    unit, scale = names.byte_unit(list(peaks.values()))
    plotted = sorted(_marker_points(fig))
    assert len(plotted) == len(peaks)
    stored = sorted(
        (value / scale, acc)
        for (model, loops), value in peaks.items()
        for acc in points.loc[(points.model == model) & (points.loops == loops), "accuracy"]
    )
    assert np.allclose(plotted, stored)
    # Per model a trace and its legend key, a legend-only shape key per loop count, and the frontier line; no text beside points.
    assert len(fig.data) == 2 * points["model"].nunique() + points["loops"].nunique() + 1
    assert len(_model_traces(fig)) == points["model"].nunique()
    assert all(trace.mode in ("markers", "lines") and not trace.text for trace in fig.data)
    assert fig.layout.xaxis.rangemode == "tozero"
    assert f"decimal {unit}" in fig.layout.xaxis.title.text and "bytes" in fig.layout.xaxis.title.text
    assert "decimal" in _annotations(fig)
    assert fig.layout.title.text.endswith(f"<sup>{figures.plain(points['set_label'].iloc[0])}</sup>"), (
        "the title names the set"
    )
    hover = _model_traces(fig)[0].hovertemplate
    for field in ("model", "accuracy", unit, "samples"):
        assert field in hover
    assert all(r.startswith("r=") for r in _model_traces(fig)[0].customdata[:, 0])


def test_kv_pool_reserved_is_plotted_from_its_stored_peak_and_offered_by_both_selectors(
    engine, results_url: str
) -> None:
    """Every engine run of the sweep stores its largest block pool, at least its KV peak; the report's and the
    app's measure selectors offer it."""
    points = accuracy_points(engine, None)
    reserved = _stored_peaks(results_url, "kv_bytes_reserved")
    assert len(reserved) == len(points) > 0
    assert all(
        reserved[(model, loops)] >= peak > 0
        for model, loops, peak in zip(points["model"], points["loops"], points["kv_bytes_allocated"])
    )
    fig = figures.accuracy_vs_memory(points, "kv_bytes_reserved")
    _, scale = names.byte_unit(list(reserved.values()))
    assert sorted(x for x, _ in _marker_points(fig)) == pytest.approx(
        sorted(value / scale for value in reserved.values())
    )
    assert "KV pool reserved peak" in fig.layout.xaxis.title.text

    options = re.search(r'<select id="measure">(.*?)</select>', build_report(engine)).group(1)
    assert '<option value="kv_bytes_reserved">KV pool reserved peak</option>' in options
    *_, options, _ = set_choices(engine, queries.latest_set(engine), None)
    assert {"label": "KV pool reserved peak", "value": "kv_bytes_reserved"} in options


def test_marker_shape_is_the_loop_count(engine) -> None:
    """Each (model, r) marker's shape is its loop count's, and the legend has one entry per shape."""
    points = accuracy_points(engine, None)
    fig = figures.accuracy_vs_memory(points, "kv_bytes_allocated")
    key = {trace.name: trace.marker.symbol for trace in fig.data if (trace.legendgroup or "").startswith("loops")}
    assert sorted(key) == sorted(names.loops_label(r) for r in points["loops"].unique())
    assert len(set(key.values())) == len(key), "every loop count has its own shape"
    for trace in _model_traces(fig):
        assert [key[r] for r in trace.customdata[:, 0]] == list(trace.marker.symbol)


def test_a_models_legend_entry_is_its_colour_not_its_first_points_marker(engine) -> None:
    """The legend draws a trace's first marker, so each model's entry is a legend-only plain circle of its colour
    (never a ringed diamond copied from one of its points), grouped with its points so a click hides them."""
    points = accuracy_points(engine, None)
    fig = figures.accuracy_vs_memory(points, "kv_bytes_allocated")
    for trace in _model_traces(fig):
        assert trace.showlegend is False
        (entry,) = [t for t in fig.data if t.legendgroup == trace.legendgroup and t.customdata is None]
        assert entry.name == trace.name and entry.showlegend is not False and list(entry.x) == [None]
        assert (
            entry.marker.symbol == "circle" and entry.marker.color == trace.marker.color and not entry.marker.line.width
        )
    assert fig.layout.legend.groupclick == "togglegroup"
    titles = [t.legendgrouptitle.text for t in fig.data if t.legendgrouptitle.text]
    assert titles == ["model", "loops (shape)"]


def test_frontier_is_exactly_the_non_dominated_points(engine, results_url: str) -> None:
    # Random tiny models score 0 everywhere; spread the suite averages so the frontier has a shape.
    with create_engine(results_url).begin() as conn:
        run_ids = [row[0] for row in conn.execute(text("SELECT run_id FROM task_metrics WHERE task = 'all'"))]
        for run_id, value in zip(run_ids, np.random.default_rng(1).permutation(len(run_ids)) / len(run_ids)):
            conn.execute(
                text("UPDATE task_metrics SET value = :v WHERE run_id = :r"),  # every task: the mean is v
                {"v": float(value), "r": run_id},
            )
    points = accuracy_points(engine, None)
    assert points["accuracy"].nunique() == len(points) > 2
    for measure in ("kv_bytes_allocated", measures.WEIGHTS_PLUS_KV, "rss", measures.ANALYTIC):
        fig = figures.accuracy_vs_memory(points, measure)
        plotted = _marker_points(fig)
        front = _frontier(fig)
        assert set(zip(front.x, front.y)) == brute_force_frontier(plotted), measure
        assert list(front.x) == sorted(front.x), "the frontier is drawn left to right"
        ringed = {
            (x, y)
            for trace in fig.data
            if trace.customdata is not None
            for x, y, width in zip(trace.x, trace.y, trace.marker.line.width)
            if width > 0
        }
        assert ringed == set(zip(front.x, front.y))


def test_unavailable_measure_is_named_not_drawn_as_zero(engine, results_url: str) -> None:
    points = accuracy_points(engine, None)
    unavailable = [m for m in ("nvml_process", "torch_allocated") if not _stored_peaks(results_url, m)]
    if not unavailable:
        pytest.skip("NVML and torch peaks were measured here (a GPU machine); nothing is unavailable")
    for measure in unavailable:
        fig = figures.accuracy_vs_memory(points, measure)
        assert _marker_points(fig) == []
        assert "unavailable" in _annotations(fig)
        loops_fig = figures.accuracy_vs_loops(points, measure)
        assert all(trace.yaxis != "y2" for trace in loops_fig.data), "no memory line for an unavailable measure"
        assert "unavailable" in _annotations(loops_fig)


def test_partly_unavailable_measure_names_the_missing_points(engine) -> None:
    points = accuracy_points(engine, None)
    points.loc[points.index[0], "kv_bytes_allocated"] = math.nan
    fig = figures.accuracy_vs_memory(points, "kv_bytes_allocated")
    assert len(_marker_points(fig)) == len(points) - 1
    first = points.iloc[0]
    assert f"{first.model} r={first.loops}" in _annotations(fig)


def test_long_unavailable_notes_wrap_inside_the_plot(engine) -> None:
    """Naming every run an unavailable measure misses takes several lines, none wider than the plot holds."""
    points = accuracy_points(engine, None)
    points = pd.concat([points.assign(model=points["model"] + f"-copy{i}") for i in range(4)], ignore_index=True)
    fig = figures.accuracy_vs_memory(points.assign(nvml_process=math.nan), "nvml_process")
    (note,) = fig.layout.annotations
    lines = note.text.split("<br>")
    assert len(lines) > 2 and max(map(len, lines)) <= figures.MESSAGE_WIDTH
    assert all(f"{row.model} r={row.loops}" in " ".join(lines) for row in points.itertuples())


def test_suite_mean_has_the_combined_stderr(engine, results_url: str) -> None:
    """ "all" gets error bars: the suite mean's stderr is sqrt(sum of the tasks' squared stderrs) / n."""
    with create_engine(results_url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.model_spec, COALESCE(r.loops, 1), m.stderr FROM runs r "
                "JOIN task_metrics m ON m.run_id = r.id WHERE m.task != 'all' AND m.metric LIKE 'pass@k:k=1%'"
            )
        )
        stderrs: dict[tuple[str, int], list[float]] = {}
        for model, loops, stderr in rows:
            stderrs.setdefault((model, loops), []).append(stderr)
    points = accuracy_points(engine, None)
    assert len(points) == len(stderrs)
    for row in points.itertuples():
        errors = stderrs[(row.model, row.loops)]
        assert row.stderr == pytest.approx(math.sqrt(sum(e * e for e in errors)) / len(errors))
    fig = figures.accuracy_vs_memory(points, "kv_bytes_allocated")
    bars = [e for trace in _model_traces(fig) for e in trace.error_y.array]
    assert len(bars) == len(points) and all(np.isfinite(bars))


def test_answer_names_the_best_accuracy_per_gb_and_the_frontier(engine, results_url: str) -> None:
    with create_engine(results_url).begin() as conn:  # spread the accuracies, as in the frontier test
        run_ids = [row[0] for row in conn.execute(text("SELECT run_id FROM task_metrics WHERE task = 'all'"))]
        for run_id, value in zip(run_ids, np.random.default_rng(2).permutation(len(run_ids)) / len(run_ids)):
            conn.execute(text("UPDATE task_metrics SET value = :v WHERE run_id = :r"), {"v": float(value), "r": run_id})
    points = accuracy_points(engine, None)

    def best(measure: str) -> tuple[str, int]:
        per_gb = {
            (m, r): a / (v / 1e9) for m, r, a, v in zip(points.model, points.loops, points.accuracy, points[measure])
        }
        return max(per_gb, key=per_gb.get)

    for measure in ("kv_bytes_allocated", "rss", measures.WEIGHTS_PLUS_KV):
        sentence = answer(points, measure)
        best_model, best_loops = best(measure)
        assert sentence.startswith(
            f"Best by pass@1 per GB of {names.measure_words(measure)}: {best_model} r={best_loops} ("
        )
        assert ("weights not counted" in sentence.split(":")[0]) == (measure == "kv_bytes_allocated")
        front = brute_force_frontier(list(zip(points[measure], points["accuracy"])))
        named = sentence.split("the frontier: ")[1]
        on_front = [
            (m, r)
            for m, r, v, a in zip(points.model, points.loops, points[measure], points.accuracy)
            if (v, a) in front
        ]
        assert named.split("; by ")[0].count(" → ") == len(on_front) - 1, "each point of the frontier once"
        assert all(f"{m} r={r} (" in named for m, r in on_front)
        for other in (
            "kv_bytes_allocated",
            "rss",
            measures.WEIGHTS_PLUS_KV,
        ):  # the sentence says where another measure's winner differs
            model, loops = best(other)
            said = f"{names.measure_label(other)}{' alone' if other in names.KV_ONLY else ''}"
            assert (said in named) == (other != measure and best(other) != best(measure)), (measure, other)
            if said in named:
                assert f"{model} r={loops} would rank first" in named.split(said)[1]
    assert "unavailable" in answer(points.assign(nvml_process=math.nan), "nvml_process")


def test_analytic_measure_follows_the_stored_config(engine) -> None:
    short = accuracy_points(engine, None, context_tokens=1024)
    long = accuracy_points(engine, None, context_tokens=4096)
    assert short[measures.ANALYTIC].notna().all(), "engine presets store a LoopConfig, so the estimate exists"
    assert (long[measures.ANALYTIC] > short[measures.ANALYTIC]).all(), "more context, more KV"
    assert math.isnan(analytic_bytes({"family": "transformers", "config": {"model_type": "x"}}, 1024))


def test_accuracy_vs_loops_labels_every_loop_count(engine) -> None:
    """Loop counts that are not powers of two get a tick too (Plotly's own log ticks skip them)."""
    points = accuracy_points(engine, None)
    points.loc[points.index[-1], "loops"] = 3
    fig = figures.accuracy_vs_loops(points, "kv_bytes_allocated")
    assert list(fig.layout.xaxis.tickvals) == sorted(points["loops"].unique())
    assert list(fig.layout.xaxis.ticktext) == [str(r) for r in sorted(points["loops"].unique())]


def test_accuracy_vs_loops_has_accuracy_and_memory_per_model(engine) -> None:
    points = accuracy_points(engine, None)
    fig = figures.accuracy_vs_loops(points, "kv_bytes_allocated")
    accuracy = [t for t in fig.data if t.yaxis in (None, "y")]
    memory = [t for t in fig.data if t.yaxis == "y2"]
    assert len(accuracy) == len(memory) == points["model"].nunique()
    assert sum(len(t.x) for t in accuracy) == len(points)
    unit, _ = names.byte_unit(points["kv_bytes_allocated"])
    assert f"decimal {unit}" in fig.layout.yaxis2.title.text
    assert fig.layout.xaxis.title.text == "loops (r)"


def test_memory_over_run_draws_each_available_measure_against_time_and_tokens(engine) -> None:
    run_id = int(queries.runs(engine)["run_id"].iloc[-1])
    series = queries.memory_series(engine, run_id)
    assert len(series) > 0, "the sampler wrote a time series"
    available = [m for m in measures.SERIES_MEASURES if series[m].notna().any()]
    missing = [m for m in measures.SERIES_MEASURES if m not in available]
    assert "rss" in available and "kv_bytes_allocated" in available and "kv_bytes_reserved" in available
    kv = series.dropna(subset=["kv_bytes_used", "kv_bytes_allocated", "kv_bytes_reserved"])
    assert len(kv) == len(series) and (kv["kv_bytes_reserved"] > 0).any()
    assert (
        (kv["kv_bytes_used"] <= kv["kv_bytes_allocated"]) & (kv["kv_bytes_allocated"] <= kv["kv_bytes_reserved"])
    ).all()
    fig = trace_figures.memory_over_run(series, measures.SERIES_MEASURES)
    assert sorted(t.legendgroup for t in fig.data) == sorted(available * 2)
    # the legend reads each measure's label, never its stored name: "KV cache used", "process RSS (CPU)"
    assert {t.name for t in fig.data} == {trace_figures.reading_label(m) for m in available}
    assert "process RSS (CPU)" in {t.name for t in fig.data} and not {t.name for t in fig.data} & set(available)
    assert {t.xaxis for t in fig.data} == {"x", "x2"}
    for trace in fig.data:
        assert len(trace.x) == series[trace.legendgroup].notna().sum()
    if missing:
        annotations = _annotations(fig).replace("<br>", " ")
        assert all(trace_figures.reading_label(m) in annotations for m in missing) and "unavailable" in annotations
    unit, _ = names.byte_unit(np.concatenate([series[m].dropna().to_numpy() for m in available]))
    assert f"decimal {unit}" in fig.layout.yaxis.title.text


def test_memory_vs_context_names_the_loops_each_profile_ran_at(engine) -> None:
    """A profile at the model's own loops stores no per-point count: the legend reads the r it ran at, never r=nan."""
    stored = queries.profile_points(engine)
    assert stored["loops"].isna().any(), "the fixture profiles a plain model at its own loops"
    profile = profile_points(engine)
    assert profile["loops"].notna().all()
    assert set(profile.loc[profile["model"] == "preset:qwen3-tiny", "loops"]) == {1}
    names = [trace.name for trace in trace_figures.memory_vs_context(profile, measures.PROFILE_MEASURES).data]
    assert not any("nan" in name for name in names)
    assert any(name.startswith("preset:qwen3-tiny r=1 ") for name in names)


def test_memory_vs_context_shows_measured_points_beside_analytic_lines(engine) -> None:
    profile = profile_points(engine)
    assert len(profile) > 0, "loopeval profile wrote points"
    fig = trace_figures.memory_vs_context(profile, measures.PROFILE_MEASURES)
    drawn = [t for t in fig.data if t.x[0] is not None]  # the legend's keys draw nothing
    lines = [t for t in drawn if t.mode == "lines"]
    markers = [t for t in drawn if t.mode == "markers"]
    groups = profile.groupby(["model", "loops", "batch"]).ngroups
    assert [t.name for t in fig.data if t.showlegend is not False and t.legendgroup != "key"] == sorted(
        {t.legendgroup for t in drawn}
    ), "one legend entry per (model, loops, batch)"
    assert len(lines) == 2 * groups  # analytic KV and analytic weights + KV per (model, loops, batch)
    measured = [m for m in measures.PROFILE_MEASURES if profile[m].notna().any()]
    assert sum(len(t.x) for t in markers) == sum(int(profile[m].notna().sum()) for m in measured)
    assert fig.layout.xaxis.title.text == "context length (tokens)"
    assert "decimal" in fig.layout.yaxis.title.text or "bytes" in fig.layout.yaxis.title.text


def test_axis_titles_name_the_decimal_unit() -> None:
    assert figures.unit_title("KV", "GB", 1e9) == "KV (decimal GB, 1e9 bytes)"


def test_empty_inputs_say_so() -> None:
    empty = pd.DataFrame(columns=["model", "loops", "accuracy", "stderr", "metric", "n_samples", "kv_bytes_allocated"])
    for fig in (
        figures.accuracy_vs_memory(empty, "kv_bytes_allocated"),
        figures.accuracy_vs_loops(empty, "kv_bytes_allocated"),
        trace_figures.memory_over_run(pd.DataFrame(), measures.SERIES_MEASURES),
        trace_figures.memory_vs_context(pd.DataFrame(), measures.PROFILE_MEASURES),
    ):
        assert len(fig.data) == 0 and _annotations(fig)


def test_sample_filters_partition_the_scored_samples(engine) -> None:
    everything = sample_queries.sample_spread(engine, EVERY)
    assert len(everything) == sample_queries.count_samples(engine) > 0
    correct = sample_queries.sample_spread(engine, EVERY, correct=True)
    wrong = sample_queries.sample_spread(engine, EVERY, correct=False)
    assert len(correct) + len(wrong) == everything["score"].notna().sum()
    assert (correct["score"] >= 1).all() and (wrong["score"] < 1).all()
    for task, model in itertools.islice(everything[["task", "model"]].drop_duplicates().itertuples(index=False), 3):
        subset = sample_queries.sample_spread(engine, EVERY, task=task, model=model)
        assert len(subset) == ((everything.task == task) & (everything.model == model)).sum()


def test_report_texts_carry_no_markdown(engine) -> None:
    """Plotly shows backticks as they are: no title, note or answer the report can show has one."""
    from dashboards.report import report_figures

    blobs = report_figures(engine)
    texts = [blob for blob in blobs.values() if isinstance(blob, str)]
    for blob in blobs.values():
        if isinstance(blob, dict):
            texts += [note["text"] for note in blob["layout"].get("annotations", [])]
            texts.append(blob["layout"].get("title", {}).get("text", ""))
    empty = [
        trace_figures.memory_vs_context(pd.DataFrame(), measures.PROFILE_MEASURES),
        trace_figures.memory_over_run(pd.DataFrame(), measures.SERIES_MEASURES),
    ]
    texts += [note.text for fig in empty for note in fig.layout.annotations]
    assert len(texts) > 100 and not [text for text in texts if "`" in text]


@pytest.mark.slow  # a whole `loopeval profile` in a process of its own
def test_the_empty_profile_figure_suggests_a_command_that_runs_as_printed(tmp_path) -> None:
    """Its lengths fit a shipped model's 512-token context (1024 and 4096 fit none of them)."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    note = _annotations(trace_figures.memory_vs_context(pd.DataFrame(), measures.PROFILE_MEASURES))
    command = re.search(r"loopeval profile \S+ --lengths \S+", note).group(0)
    assert command == names.PROFILE_EXAMPLE
    argv = [str(Path(sys.executable).with_name("loopeval")), *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    stored = queries.profile_points(open_existing(str(tmp_path / "results" / "loopeval.sqlite")))
    assert sorted(stored["context_tokens"]) == [64, 256, 448]


@pytest.mark.slow  # a whole `loopeval probe` in a process of its own
def test_the_empty_probe_figure_suggests_a_command_that_runs_as_printed(tmp_path) -> None:
    """The report of a database without probe runs (the default job's) says how to make one, and the command works."""
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    note = _annotations(trace_figures.loop_probes(pd.DataFrame(), "Loop probes"))
    command = re.search(r"loopeval probe \S+", note).group(0)
    assert command == trace_figures.PROBE_EXAMPLE and "loopeval probe MODEL" in note
    argv = [str(Path(sys.executable).with_name("loopeval")), *shlex.split(command)[1:]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not queries.probe_values(open_existing(str(tmp_path / "results" / "loopeval.sqlite"))).empty


def test_every_figure_gives_a_model_the_pages_colour_and_an_r_its_shape(engine) -> None:
    """The page's map (`model_colors`, every model of the database) colours each figure, whichever models it shows:
    a figure of one model draws it in the page's colour, not in the palette's first."""
    colors = figures.model_colors(queries.models(engine))
    assert len(set(colors.values())) == len(colors) > 2
    points = accuracy_points(engine, None)
    last = sorted(points["model"].unique())[-1]
    alone = points[points["model"] == last]
    drawn = {
        figures.accuracy_vs_memory(alone, "rss", colors=colors).data[1].marker.color,
        figures.accuracy_vs_loops(alone, "rss", colors=colors).data[0].line.color,
    }
    assert drawn == {colors[last]} != {figures.accuracy_vs_memory(alone, "rss").data[1].marker.color}
    fig = figures.accuracy_vs_memory(points, "rss", colors=colors)
    for trace in fig.data:
        if trace.x[0] is not None and trace.name in colors:  # a model's points: its colour, a shape per r
            assert trace.marker.color == colors[trace.name]
            assert list(trace.marker.symbol) == [
                figures.loops_symbol(r) for r in points.loc[points["model"] == trace.name, "loops"]
            ]
    assert [figures.loops_symbol(r) for r in (1, 2, 4)] == ["circle", "square", "triangle-up"]
    ordered = figures.model_colors(["a", "b", "c"], first=["c"])  # the opening set's models take the first colours
    assert list(ordered) == ["c", "a", "b"] and list(ordered.values()) == list(
        figures.model_colors(["a", "b", "c"]).values()
    )


def test_the_loops_figure_draws_each_models_headline_line_and_names_what_it_leaves_out() -> None:
    """An exit sweep's thresholds stacked a dozen markers at one r: the figure draws each model's plain line (one
    legend entry, its memory line toggled with it in the model's group and colour) and its footnote says how many
    points it left out and which figures show them."""
    rows = [
        (model, r, t, 0.5, 1e6 * r)
        for model in ("m", "n")
        for r in (1, 2, 4)
        for t in (None, 0.5, 0.7, 0.9)
        if t is None or r == 4
    ]
    points = pd.DataFrame(rows, columns=["model", "loops", "exit_threshold", "accuracy", "rss"]).assign(
        exit_criterion=lambda f: np.where(f["exit_threshold"].notna(), "gate", None),
        stderr=0.01,
        metric="pass@1",
        run_id=range(1, len(rows) + 1),
    )
    colors = {"m": "#111111", "n": "#222222"}
    fig = figures.accuracy_vs_loops(points, "rss", colors=colors)
    shown = [trace for trace in fig.data if trace.showlegend is not False]
    assert [trace.name for trace in shown] == ["m", "n"] and len(fig.data) == 4, "a line per model, memory beside it"
    assert all(list(trace.x) == [1, 2, 4] for trace in fig.data)
    for trace in fig.data:
        assert trace.line.color == colors[trace.legendgroup]
    note = fig.layout.annotations[-1].text.replace("<br>", " ")
    assert "6 points with an exit threshold or a KV setting are left out" in note and figures.HEADLINE_NOTE in note
    assert fig.layout.yaxis2.tickmode == "auto", "the memory axis ticks its own round values, not the left axis's grid"


def test_footnotes_hang_a_fixed_gap_below_the_plot_with_room_for_them(engine) -> None:
    """A footnote sits `FOOTNOTE_GAP` pixels under the plot area, below the axis title, in a margin tall enough
    for its lines (the browser test measures that nothing overlaps)."""
    profile = profile_points(engine)
    fig = trace_figures.memory_vs_context(profile, measures.PROFILE_MEASURES)
    note = fig.layout.annotations[-1]
    assert (note.y, note.yanchor, note.yshift) == (0, "top", -figures.FOOTNOTE_GAP)
    assert fig.layout.margin.b >= figures.FOOTNOTE_GAP + 18 * (note.text.count("<br>") + 1)


def test_an_exit_line_ends_at_the_same_models_run_without_a_threshold() -> None:
    """The default sweep runs thresholds below 1 only: each (model, r) line of swept thresholds ends at that model's
    run at r without one (every loop), which stays on the model's line through its r as well."""
    rows = [
        ("m", 1, None, 1.0, 0.40),
        ("m", 2, None, 2.0, 0.55),
        ("m", 4, None, 4.0, 0.70),
        ("m", 4, 0.5, 2.5, 0.69),
        ("m", 4, 0.7, 3.0, 0.70),
        ("other", 4, None, 4.0, 0.30),
    ]
    points = pd.DataFrame(rows, columns=["model", "loops", "exit_threshold", "loops_per_token", "accuracy"]).assign(
        exit_criterion=lambda f: np.where(f["exit_threshold"].notna(), "gate", None),
        stderr=0.01,
        metric="pass@1",
        seconds_per_token=0.001,
        run_id=range(1, len(rows) + 1),
    )
    fig = cost_figures.accuracy_vs_compute(points, "loops_per_token")
    drawn = sorted(sorted((float(x), custom[1]) for x, custom in zip(trace.x, trace.customdata)) for trace in fig.data)
    assert drawn == [
        [(1.0, "-"), (2.0, "-"), (4.0, "-")],  # m against its fixed r
        [(2.5, "gate 0.5"), (3.0, "gate 0.7"), (4.0, "-")],  # m at r=4 over its thresholds, then every loop
        [(4.0, "-")],
    ]  # other: swept nowhere, one line as before
    timed = cost_figures.accuracy_vs_compute(points, "seconds_per_token")  # 0.001 s a token reads 1 ms
    assert {float(x) for trace in timed.data for x in trace.x} == {1.0}
    assert timed.layout.xaxis.title.text == "generate milliseconds per generated token (ms)"
