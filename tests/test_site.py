"""The rendered site, as a reviewer opens it: built with the README's command, every page
loaded from disk in headless Chromium with the network cut off.

Checked on every page: nothing is fetched from outside the site folder (no CDN), no
script error, every math element typeset by MathJax without a TeX error, every image
loaded (plots as retina PNG, shown at a readable width), every stored output shown whole
on a 1280-pixel screen (no output box that scrolls sideways), and no absolute machine
path or full Python traceback in the text.

Checked again at a phone's width (390 CSS pixels): the page itself never scrolls sideways
and nothing sticks out past the screen unless it sits in a box that scrolls sideways on its
own (a wide table or code block scrolls inside its box); every table cell with text keeps
a readable width; every plot keeps at least 600 pixels, so its 9-pt text stays legible.
Set ``TETRT_SITE_SHOTS`` to a folder to get a screenshot of every page at both widths.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Text that must never reach a page: where the machine keeps things, and the head of a
# full Python traceback (notebooks store short errors: see tetrt_support.notebook).
FORBIDDEN_TEXT = sorted({str(ROOT), sys.prefix, tempfile.gettempdir() + "/", "site-packages",
                         "ipykernel_", "/home/", "/root/", "Traceback (most recent call last)"})


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The README's site command, with warnings made errors so a broken page fails here."""
    out = tmp_path_factory.mktemp("site") / "site"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                             "docs", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"site build failed:\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def browser():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    executable = _chromium()
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


PHONE = {"width": 390, "height": 844}
# furo's drawers (the navigation and the table of contents) wait off the screen until opened.
OFF_SCREEN_BY_DESIGN = ".sidebar-drawer, .toc-drawer"
PHONE_CHECK = """() => {
  const width = document.documentElement.clientWidth;
  const scrolls = e => { for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(a).overflowX)
          && a.getBoundingClientRect().right <= width + 1) return true; } return false; };
  const sticking = [...document.querySelectorAll('body *')].filter(e => {
      const r = e.getBoundingClientRect();
      return r.width > 0 && r.right > width + 1 && !e.closest('%s') && !scrolls(e); })
    .map(e => e.tagName.toLowerCase() + (e.className ? '.' + String(e.className).split(' ')[0] : '')
               + ' ' + (e.innerText || '').slice(0, 60));
  const narrow = [...document.querySelectorAll('article td, article th')]
    .filter(c => c.innerText.trim().length > 12 && c.getBoundingClientRect().width < 100)
    .map(c => c.innerText.trim().slice(0, 40));
  const small = [...document.querySelectorAll('.cell_output img')]
    .filter(i => i.getBoundingClientRect().width < 600).map(i => i.getAttribute('src'));
  return {page: [document.documentElement.scrollWidth, width], sticking: sticking.slice(0, 5),
          narrow: narrow.slice(0, 5), small: small.slice(0, 5)};
}""" % OFF_SCREEN_BY_DESIGN


def _pages(site: pathlib.Path) -> list[pathlib.Path]:
    return sorted(site.rglob("*.html"))


def test_site_has_an_index_linking_every_notebook(site: pathlib.Path) -> None:
    index = (site / "index.html").read_text()
    for notebook in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert f'href="notebooks/{notebook.stem}.html"' in index, f"index does not link {notebook.name}"
        assert (site / "notebooks" / f"{notebook.stem}.html").exists()


def test_every_page_renders_offline_in_chromium(site: pathlib.Path, browser) -> None:
    problems: list[str] = []
    for path in _pages(site):
        name = path.relative_to(site).as_posix()
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        outside: list[str] = []
        errors: list[str] = []

        def route(r, outside=outside):
            if r.request.url.startswith("file://") or r.request.url.startswith("data:"):
                r.continue_()
            else:
                outside.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
        page.goto(path.as_uri(), wait_until="load")
        math = page.evaluate("document.querySelectorAll('.math').length")
        if math:
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise")
            page.evaluate("MathJax.startup.promise")
            untypeset = page.evaluate(
                "[...document.querySelectorAll('.math')].filter(e => !e.querySelector('mjx-container svg')).length")
            tex_errors = page.evaluate("document.querySelectorAll('mjx-merror, [data-mjx-error]').length")
            if untypeset or tex_errors:
                problems.append(f"{name}: {untypeset} of {math} math elements not typeset, {tex_errors} TeX errors")
        for src, complete, natural, shown in page.evaluate(
                "[...document.images].map(i => [i.getAttribute('src'), i.complete, i.naturalWidth, i.width])"):
            if not complete or natural == 0:
                problems.append(f"{name}: image {src} did not load")
            elif "_images/" in src and (shown < 400 or natural < 1.5 * shown):
                problems.append(f"{name}: plot {src} is {natural} px shown at {shown} px "
                                "(want a retina PNG at least 400 px wide: tetrt_support.notebook.setup)")
        for kind, widest in page.evaluate(
                "[...document.querySelectorAll('.cell_output pre, .cell_output table')]"
                ".filter(e => e.scrollWidth > e.clientWidth + 1)"
                ".map(e => [e.tagName, e.innerText.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '')])"):
            problems.append(f"{name}: a stored {kind.lower()} output is cut off at 1280 pixels: {widest[:100]!r}")
        text = page.inner_text("body")
        for forbidden in FORBIDDEN_TEXT:
            for match in re.finditer(re.escape(forbidden), text):
                line = text[text.rfind("\n", 0, match.start()) + 1:text.find("\n", match.end())]
                problems.append(f"{name}: {forbidden!r} on the page: {line.strip()[:160]}")
                break
        if page.query_selector(".system-message"):
            problems.append(f"{name}: a docutils error message is on the page")
        problems += [f"{name}: fetched {url} (the site must be self-contained)" for url in outside]
        problems += [f"{name}: script error: {e}" for e in errors]
        page.close()
    assert not problems, "\n".join(problems)


def test_every_page_reads_on_a_phone(site: pathlib.Path, browser) -> None:
    shots = os.environ.get("TETRT_SITE_SHOTS")
    problems: list[str] = []
    for path in _pages(site):
        name = path.relative_to(site).as_posix()
        for viewport in (PHONE, {"width": 1280, "height": 900}) if shots else (PHONE,):
            page = browser.new_page(viewport=viewport)
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file://", "data:")) else r.abort())
            page.goto(path.as_uri(), wait_until="load")
            if shots:
                pathlib.Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(pathlib.Path(shots) / f"{name.replace('/', '_')}_{viewport['width']}.png"))
            if viewport is PHONE:
                found = page.evaluate(PHONE_CHECK)
                scroll_width, width = found["page"]
                if scroll_width > width:
                    problems.append(f"{name}: the page scrolls sideways at {width} px ({scroll_width} px wide)")
                problems += [f"{name}: sticks out past a {width}-px screen, in no scrolling box: {e!r}"
                             for e in found["sticking"]]
                problems += [f"{name}: a table cell is squeezed under 100 px at {width} px: {t!r}" for t in found["narrow"]]
                problems += [f"{name}: plot {src} is shown under 600 px at {width} px" for src in found["small"]]
            page.close()
    assert not problems, "\n".join(problems)
