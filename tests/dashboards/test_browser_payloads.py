"""Stored names that carry a link, a script and an event handler, in headless Chromium.

Model specs, task names and metric names come from users and plugins, and Plotly renders a subset
of HTML (`<a href>` included) in legends, titles and hover labels. Here every such name holds markup;
the static report and the served app must show it as the text it is, draw no link from it (in HTML
or in Plotly's SVG), run none of it, and send nothing anywhere: the report makes no request beyond
its own file, and the app none beyond its own origin. The security headers and the report's CSP are
checked on what the browser actually received.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.report import write_report
from tests.support.browser import CHROMIUM, POINTS, VIEWPORT, launch, open_app, open_report, record, served_app
from db.store import Store

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is absent (scripts/install.sh installs Debian's chromium)"
    ),
]

LINK = '<a href="http://127.0.0.1:9/leak">click</a>'  # port 9 (discard): a followed link would show as a request
SCRIPT = "<script>window.pwned=1</script>"
IMG = '<img src=x onerror="window.pwned=1">'
TASKS = (LINK, SCRIPT, IMG)
MODELS = tuple(f"evil:{payload}" for payload in TASKS)
# A headline metric name (it matches db.headline's pass@1 pattern) with a payload after it, so each
# task's figures put it in their y-axis title; task -> its metric.
METRICS = {LINK: f"pass@k:k=1&{SCRIPT}", SCRIPT: f"pass@k:k=1&{IMG}", IMG: f"pass@k:k=1&{LINK}"}
LINK_MODEL = MODELS[0]
# Pieces only stored data holds: an element whose text or target has one came from the database.
DATA_MARKS = ("127.0.0.1:9", "leak", "click", "pwned", "evil:")


def _store_runs(path: Path) -> str:
    """A real results database (through db.store) whose model, task and metric names are all markup."""
    store = Store.open(str(path))
    for index, model in enumerate(MODELS):
        for loops in (1, 2):
            accuracy = 0.2 + 0.2 * index + 0.05 * loops
            run = store.create_run(
                sweep_id="payload", model_spec=model, adapter="evil", loops=loops, suite="synthetic", tasks=list(TASKS)
            )
            store.add_samples(
                run,
                [
                    dict(task=task, doc_id="0", sample_index=0, prompt=task, output=task, gold=task, score=1.0)
                    for task in TASKS
                ],
            )
            store.set_metrics(
                run,
                {
                    **{task: {METRICS[task]: (accuracy, 0.05), task: (accuracy, None)} for task in TASKS},
                    "all": {"pass@1": (accuracy, None)},
                },
            )
            store.set_memory_peaks(
                run,
                {
                    "weights_bytes": 1_000_000 * (index + 1),
                    "kv_bytes_allocated": 10_000 * loops * (index + 1),
                    "rss": 200_000_000,
                },
            )
            store.add_memory_samples(
                run,
                [
                    dict(
                        t=0.02 * k,
                        phase=f"task:{SCRIPT}",
                        generated_tokens=k,
                        kv_bytes_used=1000 * k,
                        rss=100_000_000 + k,
                    )
                    for k in range(5)
                ],
            )
            store.finish_run(run, "finished", wall_seconds=1.0)
    profiled = store.create_run(
        sweep_id="profiled", kind="profile", model_spec=MODELS[2], adapter="evil", suite="profile"
    )
    store.add_profile_points(
        profiled,
        [
            dict(
                context_tokens=n,
                batch=1,
                loops=1,
                weights_bytes=1_000_000,
                kv_bytes_analytic=100 * n,
                kv_bytes_allocated=100 * n,
                rss=200_000_000,
            )
            for n in (16, 32)
        ],
    )
    store.finish_run(profiled, "finished")
    store.close()
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def names_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _store_runs(tmp_path_factory.mktemp("payload-names") / "results.sqlite")


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


def _texts(page: Any, selector: str) -> list[str]:
    """textContent of every match, SVG text included (Plotly draws legends and titles as SVG)."""
    return page.evaluate("(s) => [...document.querySelectorAll(s)].map((e) => e.textContent)", selector)


def _anchors(page: Any) -> list[dict[str, str | None]]:
    """Every <a> in the page, HTML or SVG (Plotly's `<a href>` becomes an SVG anchor with xlink:href)."""
    return page.evaluate("""() => [...document.querySelectorAll('a')].map((a) => ({
        text: a.textContent,
        href: a.getAttribute('href') || a.getAttributeNS('http://www.w3.org/1999/xlink', 'href')}))""")


def _hover_first_point(page: Any) -> str:
    """Move the mouse onto the first accuracy marker so Plotly draws its hover label; return the label's text.

    Plotly's drag layer lies over the markers, so the mouse is moved to the spot rather than
    hovering the element.
    """
    page.locator(POINTS).first.scroll_into_view_if_needed()  # the answer above may push the figure past the fold
    box = page.locator(POINTS).first.bounding_box()
    page.mouse.move(
        0, 0
    )  # off the figure first: a redrawn figure whose first marker sits where the mouse is gets no move
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_selector("#accuracy-memory .hoverlayer .hovertext", timeout=10_000)
    return "".join(_texts(page, "#accuracy-memory .hoverlayer .hovertext"))


def _requests(page: Any) -> list[str]:
    """Record every request of the page's context, so a link opened in a new tab is caught too."""
    urls: list[str] = []
    page.context.on("request", lambda request: urls.append(request.url))
    return urls


def _click_word(page: Any, selector: str, word: str = "click") -> None:
    """Click exactly where `word` is drawn inside `selector` (a link's text, were the markup rendered): the page
    must not navigate or open another."""
    page.locator(selector).first.scroll_into_view_if_needed()
    spot = page.evaluate(
        """([selector, word]) => {
        const walker = document.createTreeWalker(document.querySelector(selector), NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.data.indexOf(word);
            if (at < 0) continue;
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + word.length);
            const box = range.getBoundingClientRect();
            return {x: box.x + box.width / 2, y: box.y + box.height / 2};
        }
        return null;
    }""",
        [selector, word],
    )
    assert spot is not None, f"{word!r} is not shown in {selector}"
    before = page.url
    page.mouse.click(spot["x"], spot["y"])
    page.wait_for_timeout(500)  # a navigation or a popup would have started by now
    assert page.url == before, f"clicking the link text in {selector} navigated to {page.url}"
    assert page.context.pages == [page], f"clicking the link text in {selector} opened another page"


def _nothing_ran_and_no_link(page: Any, own: tuple[str, ...]) -> None:
    """No payload ran or became an element, and no <a> came from data or points away from the page (`own` prefixes)."""
    assert page.evaluate("typeof window.pwned") == "undefined"
    assert page.locator("img[src='x']").count() == 0
    assert page.evaluate("document.querySelectorAll('[onerror]').length") == 0
    anchors = _anchors(page)
    from_data = [a for a in anchors if any(mark in (a["text"] or "") + (a["href"] or "") for mark in DATA_MARKS)]
    assert from_data == [], f"links drawn from stored names: {from_data}"
    leaving = [a for a in anchors if a["href"] and not a["href"].startswith(("#", *own))]
    assert leaving == [], f"links out of the page: {leaving}"


def _names_shown_as_text(page: Any) -> None:
    """The default view: every model is a legend entry spelled exactly as stored, and the hover label names one."""
    legend = _texts(page, "#accuracy-memory .legendtext")
    assert set(MODELS) <= set(legend), legend
    hover = _hover_first_point(page)
    assert any(f"model {model}" in hover for model in MODELS), hover
    assert page.locator("#accuracy-memory .hoverlayer a").count() == 0


def _task_figure_shows(page: Any, task: str) -> None:
    """After choosing `task`: its title and the y-axis (its metric's name) show the stored markup as text."""
    # The subtitle (the evaluation set) names every task, so wait on the y-axis: the chosen task's metric.
    page.wait_for_function(
        "(m) => document.querySelector('#accuracy-memory .g-ytitle').textContent.includes(m)", arg=METRICS[task]
    )
    assert task in _texts(page, "#accuracy-memory .gtitle")[0]
    assert METRICS[task] in _texts(page, "#accuracy-memory .g-ytitle")[0]
    assert any(METRICS[task] in text for text in _texts(page, "#accuracy-loops .g-ytitle"))
    hover = _hover_first_point(page)
    assert any(model in hover for model in MODELS), hover


def test_report_shows_markup_names_as_text_and_stays_offline(page, names_url: str, tmp_path: Path) -> None:
    report = write_report(names_url, tmp_path / "report.html")
    seen, requests = record(page), _requests(page)
    open_report(page, report)
    csp = page.locator('meta[http-equiv="Content-Security-Policy"]').get_attribute("content")
    assert "form-action 'none'" in csp and "default-src 'none'" in csp

    _nothing_ran_and_no_link(page, own=(report.resolve().as_uri(),))
    _names_shown_as_text(page)
    run_label = page.locator("#run option").first.text_content()
    assert LINK_MODEL in run_label
    assert LINK_MODEL in _texts(page, "#memory-run .gtitle")[0]
    assert any(MODELS[2] in text for text in _texts(page, "#memory-context .legendtext"))
    assert set(TASKS) <= set(_texts(page, "#task option"))
    for task in (SCRIPT, IMG, LINK):  # the link's task last: its title is clicked below
        page.select_option("#task", task)
        _task_figure_shows(page, task)
    for model in MODELS:
        assert page.locator("table.runs td").filter(has_text=model).count() >= 2  # loops 1 and 2

    _nothing_ran_and_no_link(page, own=(report.resolve().as_uri(),))  # with every figure and hover label drawn
    for where in (
        "#accuracy-memory .gtitle",
        "#accuracy-memory .legend",
        "#memory-run .gtitle",
        "table.runs",
        "#samples",
    ):
        _click_word(page, where)
    # Should escaping ever miss, the report's last defence holds: any anchor, an SVG one with xlink:href as
    # Plotly draws them included, is inert.
    page.evaluate("""() => document.body.insertAdjacentHTML('beforeend', '<svg id="drawn" width="200" height="40">'
        + '<a xlink:href="http://127.0.0.1:9/leak" target="_blank"><text x="10" y="25">click</text></a></svg>')""")
    _click_word(page, "#drawn")
    page.evaluate("document.getElementById('drawn').remove()")
    _nothing_ran_and_no_link(page, own=(report.resolve().as_uri(),))
    assert requests and all(url.startswith(("file:", "data:")) for url in requests), requests
    assert seen["errors"] == []


def test_served_app_shows_markup_names_as_text_and_stays_home(page, names_url: str) -> None:
    with served_app(names_url) as url:
        seen, requests = record(page), _requests(page)
        headers: list[tuple[str, dict[str, str]]] = []
        page.on("response", lambda response: headers.append((response.url, response.headers)))
        open_app(page, url)
        for address, received in headers:
            assert "frame-ancestors 'none'" in received.get("content-security-policy", ""), address
            assert received.get("x-frame-options") == "DENY", address

        _nothing_ran_and_no_link(page, own=(url,))
        _names_shown_as_text(page)
        assert sorted(_texts(page, "#models .dash-options-list-option-text")) == sorted(MODELS)
        assert LINK_MODEL in page.locator("#run").text_content()
        assert any(MODELS[2] in text for text in _texts(page, "#memory-context .legendtext"))
        for model in MODELS:
            assert page.locator("#samples td").filter(has_text=model).count() >= 1
        for task in (SCRIPT, IMG, LINK):  # the link's task last: its title is clicked below
            page.locator("#task").click()
            page.get_by_role("option", name=task, exact=True).click()
            _task_figure_shows(page, task)

        _nothing_ran_and_no_link(page, own=(url,))  # with every figure and hover label drawn
        for where in ("#accuracy-memory .gtitle", "#accuracy-memory .legend", "#models", "#samples"):
            _click_word(page, where)
        _nothing_ran_and_no_link(page, own=(url,))
        assert requests and all(request.startswith(url) for request in requests), requests
        assert seen["errors"] == []
