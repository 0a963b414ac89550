"""The site's two hooks in docs/conf.py: figures get their stored alt text, and the README's
notebook links (included into the index) reach the notebooks' pages."""

from __future__ import annotations

import importlib.util
import pathlib
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def conf() -> types.ModuleType:
    pytest.importorskip("myst_nb")
    spec = importlib.util.spec_from_file_location("tetrt_docs_conf", ROOT / "docs" / "conf.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except RuntimeError as error:  # the docs extra is not installed
        pytest.skip(str(error))
    return module


def test_the_readme_notebook_links_become_page_links(conf: types.ModuleType) -> None:
    content = ["| [`01_rope`](notebooks/01_rope.ipynb) | q | a |\n[other](docs/x.md)"]
    conf._readme_links_to_pages(None, pathlib.Path("../README.md"), "index", content)
    assert content == ['| <a href="notebooks/01_rope.html"><code>01_rope</code></a> | q | a |\n[other](docs/x.md)']
    untouched = ["[`01_rope`](notebooks/01_rope.ipynb)"]
    conf._readme_links_to_pages(None, pathlib.Path("other.md"), "index", untouched)
    assert untouched == ["[`01_rope`](notebooks/01_rope.ipynb)"]


def test_an_image_takes_the_alt_text_stored_with_its_output(conf: types.ModuleType, monkeypatch) -> None:
    from docutils import nodes

    monkeypatch.setattr(conf, "_render_image", lambda self, data: [nodes.image(uri="_images/0123abcd.png")])
    data = types.SimpleNamespace(output_metadata={"alt": "Lowering time, tiny Llama 4",
                                                  "image/png": {"width": 685}})
    (image,) = conf._render_image_with_alt(None, data)
    assert image["alt"] == "Lowering time, tiny Llama 4"
    (bare,) = conf._render_image_with_alt(None, types.SimpleNamespace(output_metadata={}))
    assert "alt" not in bare
