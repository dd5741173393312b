"""The report and the served app in headless Chromium: plots render, points match the database,
the memory measure switches, untrusted output stays text, and the report never touches the network."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from dashboards import figures, views
from analysis.answer import answer
from analysis.points import accuracy_points
from dashboards.data import browse_samples
from dashboards.report import SAMPLE_PAGE_ROWS, packed_plotlyjs
from harness.report import write_report
from db.session import open_existing
from db.store import Store
from db import queries
from tests.support.browser import (
    CHROMIUM,
    PAYLOAD,
    POINTS,
    VIEWPORT,
    launch,
    open_app,
    open_report,
    overlapping_texts,
    point_count,
    record,
    screenshot_app,
    screenshot_report,
    served_app,
    trace_colours,
    x_axis_title,
)


pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (scripts/install.sh --test installs Debian's chromium)"
    ),
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture()
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()


def _measured(measure: str) -> tuple[str, dict[str, str]]:
    """SQL for the runs with a stored value of every part of `measure` (the derived 'weights_bytes +
    kv_bytes_allocated' has two), and its parameters."""
    parts = {f"m{i}": part for i, part in enumerate(measure.split(" + "))}
    return (
        f"SELECT run_id FROM memory_peaks WHERE value IS NOT NULL AND measure IN ({', '.join(':' + k for k in parts)}) "
        f"GROUP BY run_id HAVING COUNT(DISTINCT measure) = {len(parts)}"
    ), parts


def _points_with(url: str, measure: str) -> int:
    """(model, loops) pairs of the default suite with a stored value of `measure`, counted in plain SQL."""
    measured, parts = _measured(measure)
    with create_engine(url).connect() as conn:
        return conn.execute(
            text(
                "SELECT COUNT(DISTINCT r.model_spec || '/' || COALESCE(r.loops, 1)) FROM runs r "
                "JOIN task_metrics m ON m.run_id = r.id AND m.task = 'all' "
                f"WHERE r.kind = 'eval' AND r.id IN ({measured})"
            ),
            parts,
        ).scalar_one()


def _payload_shown_as_text(page) -> None:
    cell = page.get_by_text(PAYLOAD, exact=True)
    assert cell.count() >= 1, "the stored markup appears literally"
    assert page.evaluate("window.pwned") is None
    assert page.locator("img[src='x']").count() == 0


def test_report_renders_offline_with_points_from_the_database(page, payload_url: str, tmp_path: Path) -> None:
    report = write_report(payload_url, tmp_path / "report.html")
    seen = record(page)
    page.add_init_script(
        "window.cspViolations = []; document.addEventListener('securitypolicyviolation',"
        " (e) => window.cspViolations.push(e.blockedURI));"
    )
    png = screenshot_report(page, report, tmp_path / "report.png")
    assert png.stat().st_size > 10_000

    measure = page.locator("#measure").input_value()
    assert point_count(page) == _points_with(payload_url, measure) > 0
    assert "decimal" in x_axis_title(page)
    # Every other selectable measure draws its own axis (or says it is unavailable).
    engine = open_existing(payload_url)
    set_id = page.locator("#set").input_value()
    assert page.locator("#answer").text_content() == answer(accuracy_points(engine, set_id), measure)
    engine.dispose()
    page.select_option("#measure", "rss")
    page.wait_for_function("document.querySelector('#accuracy-memory .xtitle').textContent.includes('RSS')")
    assert point_count(page) == _points_with(payload_url, "rss")
    assert page.evaluate("document.getElementById('accuracy-memory')._fullLayout.xaxis.range[0]") <= 0, "RSS from 0"
    if _points_with(payload_url, "nvml_process") == 0:  # a CPU machine: the note names every run, inside the plot
        page.select_option("#measure", "nvml_process")
        page.wait_for_function("document.querySelector('#accuracy-memory').textContent.includes('unavailable')")
        plot = page.locator("#accuracy-memory .main-svg").first.bounding_box()
        note = page.locator("#accuracy-memory .annotation").first.bounding_box()
        assert plot["x"] <= note["x"] and note["x"] + note["width"] <= plot["x"] + plot["width"], (note, plot)
        assert "unavailable" in page.locator("#answer").text_content()

    page.locator("#samples").scroll_into_view_if_needed()
    _payload_shown_as_text(page)
    assert seen["requests"] == [report.resolve().as_uri()], "the report made a network request"
    assert page.evaluate("window.cspViolations") == []
    assert seen["errors"] == []


def _cells(page, column: int) -> list[str]:
    return page.locator(f"#samples tbody tr td:nth-child({column})").all_text_contents()


def test_report_stays_short_and_light_with_many_long_samples(page, results_url: str, tmp_path: Path) -> None:
    """3000 more samples of 3000 characters each: the report grows by its share of them, and stays one screenful
    of samples tall, paging through the rest."""
    store = Store.open(results_url)
    run = store.create_run(
        sweep_id="big", model_spec="preset:big", adapter="engine", loops=1, suite="synthetic", tasks=["addition"]
    )
    store.add_samples(
        run,
        [
            dict(
                task="addition",
                doc_id=str(doc),
                sample_index=0,
                prompt="p",
                output="o" * 3000,
                gold="g",
                score=float(doc % 2),
            )
            for doc in range(3000)
        ],
    )
    store.finish_run(run, "finished", wall_seconds=1.0)
    store.close()
    report = write_report(results_url, tmp_path / "report.html")
    assert report.stat().st_size - len(packed_plotlyjs()) < 1_500_000, "the samples are a budget, not the whole table"
    open_report(page, report)
    # one page of samples however many are stored: the samples' section, not the page (which grows with each view)
    height = page.evaluate("document.querySelector('#samples').closest('section').scrollHeight")
    assert height < 2500, height

    engine = open_existing(results_url)
    listed = browse_samples(engine)
    engine.dispose()
    assert page.locator("#samples tbody tr").count() == SAMPLE_PAGE_ROWS
    assert f"of {len(listed)} " in page.locator("#sample-page").text_content()
    page.click("#sample-next")
    assert _cells(page, 1)[0] == str(listed["run_id"].iloc[SAMPLE_PAGE_ROWS])

    page.select_option("#sample-model", "preset:big")
    page.select_option("#sample-verdict", "wrong")
    big = listed[(listed.model == "preset:big") & (listed.verdict == "wrong")]
    assert 0 < len(big) < 3000 and f"of {len(big)} " in page.locator("#sample-page").text_content()
    docs = _cells(page, 5)
    assert docs == [str(doc) for doc in big["doc_id"].head(SAMPLE_PAGE_ROWS)]
    assert [int(doc) for doc in docs] == sorted(int(doc) for doc in docs), "numeric order: 9 before 11"
    assert set(_cells(page, 13)) == {"wrong"}


def test_served_app_switches_measure_and_shows_output_as_text(page, payload_url: str, tmp_path: Path) -> None:
    with served_app(payload_url) as url:
        assert url.startswith("http://127.0.0.1:")
        seen = record(page)
        screenshot_app(page, url, tmp_path / "app.png")
        assert (tmp_path / "app.png").stat().st_size > 10_000
        measure = page.locator("#measure input:checked").get_attribute("value")
        assert point_count(page) == _points_with(payload_url, measure) > 0
        engine = open_existing(payload_url)
        sentence = answer(accuracy_points(engine, None), measure)  # the default set: the latest
        engine.dispose()
        assert page.locator("#answer").text_content() == sentence
        before = x_axis_title(page)

        page.get_by_label("process RSS peak (CPU)").check()
        page.wait_for_function("document.querySelector('#accuracy-memory .xtitle').textContent.includes('RSS')")
        assert x_axis_title(page) != before and "decimal" in x_axis_title(page)
        assert point_count(page) == _points_with(payload_url, "rss")

        offered = page.get_by_label("NVML process peak").count() == 1  # a measure is offered only where some run has it
        assert offered == (_points_with(payload_url, "nvml_process") > 0)

        _payload_shown_as_text(page)
        assert all(request.startswith(url) for request in seen["requests"]), "the app reached outside itself"
        assert seen["errors"] == []


def _points_in_set(url: str, run_ids: list[int], measure: str) -> int:
    """(model, loops) pairs among `run_ids` with a stored `measure`, counted in plain SQL."""
    measured, parts = _measured(measure)
    with create_engine(url).connect() as conn:
        return conn.execute(
            text(
                "SELECT COUNT(DISTINCT r.model_spec || '/' || COALESCE(r.loops, 1)) FROM runs r "
                f"WHERE r.id IN ({measured}) AND r.id IN ({','.join(map(str, run_ids))})"
            ),
            parts,
        ).scalar_one()


def _set_runs(url: str) -> tuple[list[int], list[int]]:
    """The run ids of the latest sweep's set (one run) and of the first sweep's set (every other eval run)."""
    with create_engine(url).connect() as conn:
        ids = [row[0] for row in conn.execute(text("SELECT id FROM runs WHERE kind = 'eval' ORDER BY id"))]
    return ids[-1:], ids[:-1]


def test_report_switches_evaluation_sets(page, two_sets_url: str, tmp_path: Path) -> None:
    latest, older = _set_runs(two_sets_url)
    open_report(page, write_report(two_sets_url, tmp_path / "report.html"))
    measure = page.locator("#measure").input_value()
    title = "#accuracy-memory .gtitle"
    assert point_count(page) == _points_in_set(two_sets_url, latest, measure) == 1
    first, second = page.locator("#set option").evaluate_all("options => options.map(o => o.value)")
    assert f"set {first}:" in page.locator(title).text_content()
    assert page.locator("#depth-set").input_value() == second  # the first sweep ran r = 1 and 2, the latest r = 2 only
    assert f"set {second}:" in page.locator("#depth .gtitle").text_content()
    page.select_option("#set", second)
    page.wait_for_function(f"document.querySelector('{title}').textContent.includes('set {second}:')")
    assert point_count(page) == _points_in_set(two_sets_url, older, measure) > 1


def test_served_app_switches_evaluation_sets(page, two_sets_url: str) -> None:
    latest, older = _set_runs(two_sets_url)
    with served_app(two_sets_url) as url:
        open_app(page, url)
        measure = page.locator("#measure input:checked").get_attribute("value")
        title = "#accuracy-memory .gtitle"
        assert point_count(page) == _points_in_set(two_sets_url, latest, measure) == 1
        page.locator("#set").click()
        page.get_by_role("dialog").get_by_text("first 2 per task").click()  # the open menu, not the depth selector
        page.wait_for_function(f"document.querySelector('{title}').textContent.includes('first 2 per task')")
        page.wait_for_function(f"document.querySelectorAll('{POINTS}').length > 1")
        assert point_count(page) == _points_in_set(two_sets_url, older, measure)


COMPUTE_POINTS = "#accuracy-loops-per-token .scatterlayer path.point"


def _compute_points(url: str, set_id: str) -> int:
    """The set's points with generated tokens (those the accuracy-against-compute figure can place)."""
    engine = open_existing(url)
    points = accuracy_points(engine, set_id)
    engine.dispose()
    return int(points["loops_per_token"].notna().sum())


def test_report_and_app_draw_accuracy_against_loops_per_token_where_the_set_varies_it(
    page, two_sets_url: str, tmp_path: Path
) -> None:
    """The latest set holds one (model, r): nothing varies, so a note; the first sweep ran r = 1 and 2: a point each."""
    open_report(page, write_report(two_sets_url, tmp_path / "report.html"))
    assert page.locator(COMPUTE_POINTS).count() == 0
    assert "varies neither the exit threshold nor the loops" in page.locator("#accuracy-loops-per-token").text_content()
    second = page.locator("#set option").evaluate_all("options => options.map(o => o.value)")[1]
    page.select_option("#set", second)
    page.wait_for_function(f"document.querySelectorAll('{COMPUTE_POINTS}').length > 1")
    assert page.locator(COMPUTE_POINTS).count() == _compute_points(two_sets_url, second) > 1
    assert "mean loops per generated token" in page.locator("#accuracy-loops-per-token .xtitle").text_content()

    with served_app(two_sets_url) as url:
        open_app(page, url)
        page.locator("#set").click()
        page.get_by_role("dialog").get_by_text("first 2 per task").click()
        page.wait_for_function(f"document.querySelectorAll('{COMPUTE_POINTS}').length > 1")
        assert page.locator(COMPUTE_POINTS).count() == _compute_points(two_sets_url, second)
        assert page.locator("#accuracy-decode-time .scatterlayer path.point").count() == _compute_points(
            two_sets_url, second
        )


def _model_colours(page, models: list[str]) -> dict[str, set[str]]:
    """Each model's colours in the plots drawn now: every trace named after the model (its points, lines, legend key)."""
    seen: dict[str, set[str]] = {}
    for _, name, colour in trace_colours(page):
        model = next((m for m in sorted(models, key=len, reverse=True) if (name or "").startswith(m)), None)
        if model is not None:
            seen.setdefault(model, set()).add(str(colour).lower())
    return seen


def _expected_colours(url: str) -> tuple[list[str], dict[str, set[str]]]:
    """The database's models and the one colour each should have: the page's map (`views.palette`)."""
    engine = open_existing(url)
    models, colours = queries.models(engine), dict(views.palette(engine))
    engine.dispose()
    assert sorted(colours) == models and len(set(colours.values())) == len(models)
    return models, {model: {colour.lower()} for model, colour in colours.items()}


def test_a_model_keeps_its_colour_in_every_figure_of_the_report_and_the_app(
    page, two_sets_url: str, tmp_path: Path
) -> None:
    """The latest set holds one model, the first every tiny preset and zoo:ouro-tiny: the figures of both sets (and the
    depth and profile figures, which open on other sets) draw each model in the one colour of the database's map."""
    models, expected = _expected_colours(two_sets_url)
    assert expected["zoo:ouro-tiny"] == {figures.model_colors(["zoo:ouro-tiny"]).popitem()[1].lower()}, (
        "the opening set's one model takes the palette's first colour"
    )
    open_report(page, write_report(two_sets_url, tmp_path / "report.html"))
    seen = _model_colours(page, models)
    second = page.locator("#set option").evaluate_all("options => options.map(o => o.value)")[1]
    page.select_option("#set", second)
    page.wait_for_function(f"document.querySelectorAll('{POINTS}').length > 1")
    for model, colours in _model_colours(page, models).items():
        seen.setdefault(model, set()).update(colours)
    assert seen == expected, "a model drawn in two colours, or in another than the page's"
    with served_app(two_sets_url) as url:
        open_app(page, url)
        assert _model_colours(page, models) == {model: expected[model] for model in _model_colours(page, models)}
        page.locator("#set").click()
        page.get_by_role("dialog").get_by_text("first 2 per task").click()
        page.wait_for_function(f"document.querySelectorAll('{POINTS}').length > 1")
        assert _model_colours(page, models) == expected


def test_no_note_is_drawn_over_an_axis_title_in_the_report_or_the_app(page, results_url: str, tmp_path: Path) -> None:
    """Every plot of both pages (profile, memory over a run and the rest): no annotation's box meets an axis title's.
    The accuracy figure's axis titles and footnote are there to be checked, so the test can fail."""
    open_report(page, write_report(results_url, tmp_path / "report.html"))
    page.wait_for_selector("#memory-context .annotation-text-g")
    assert (
        page.locator("#accuracy-memory .xtitle").count() == 1
        and page.locator("#accuracy-memory .annotation-text-g").count() >= 1
    )
    assert overlapping_texts(page) == []
    scrolled = page.evaluate(
        "[...document.querySelectorAll('.legend .scrollbar')].map(s => s.getBoundingClientRect().height)"
    )
    assert scrolled and not any(scrolled), "a legend in a scrolling box"
    with served_app(results_url) as url:
        open_app(page, url)
        page.wait_for_selector("#memory-run .annotation-text-g")
        page.wait_for_selector("#memory-context .annotation-text-g")
        assert overlapping_texts(page) == []
