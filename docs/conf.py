"""Sphinx configuration of the rendered collection.

One command builds it, from the repository root:

    python -m sphinx -b html docs build/site

myst-nb renders each notebook's STORED outputs (nothing is executed), so the site shows
exactly what strict nbval replays. It is self-contained: every page, image and script is
under build/site (MathJax is copied from sphinx-mathjax-offline, no CDN), so the folder
can be zipped, attached to a review and opened from disk (build/site/index.html).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re

project = "tetrt"
author = "tetrt contributors"
copyright = "tetrt contributors"

extensions = ["myst_nb"]
root_doc = "index"
# docs/notebooks is a link to ../notebooks: the .ipynb files are read where they live.
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "notebooks/*.py"]
# The design notes page is optional; a traceback that Pygments cannot lex is still shown.
suppress_warnings = ["toc.empty_glob", "misc.highlighting_failure"]

# The stored outputs are the content: never re-execute a notebook while building.
nb_execution_mode = "off"
nb_merge_streams = True
# Stored errors are short (type, message, one frame): shown as plain text, since the
# traceback lexer would colour English words of a long message as Python keywords.
nb_render_error_lexer = "text"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "tetrt notebooks"
html_static_path = ["_static"]
html_css_files = ["tetrt.css"]
html_copy_source = False  # no _sources/ copies of the notebooks: the site stays small
html_show_sourcelink = False
html_last_updated_fmt = None

# MathJax 3 rendered to SVG (no web fonts to fetch), from the copy that the
# sphinx-mathjax-offline package ships; only the one combined file is copied.
_mathjax_package = importlib.util.find_spec("sphinx-mathjax-offline")
if _mathjax_package is None or not _mathjax_package.submodule_search_locations:
    raise RuntimeError("the site needs sphinx-mathjax-offline: pip install -e '.[docs]'")
_mathjax = pathlib.Path(next(iter(_mathjax_package.submodule_search_locations))) / "static" / "mathjax"
html_static_path.append(str(_mathjax / "tex-svg-full.js"))
mathjax_path = "tex-svg-full.js"
mathjax3_config = {"svg": {"fontCache": "global"}}


# A figure's alt text: the words tetrt_support.notebook stored with it (its titles, see
# figure_alt_text), not the hashed file name Sphinx falls back to. myst-nb passes only an
# output's width and height on to the image, so its image renderer is wrapped here.
from myst_nb.core.render import NbElementRenderer  # noqa: E402

_render_image = NbElementRenderer.render_image


def _render_image_with_alt(self, data):
    image_nodes = _render_image(self, data)
    alt = (data.output_metadata or {}).get("alt")
    for node in image_nodes:
        if alt and not node.get("alt"):
            node["alt"] = str(alt)
    return image_nodes


NbElementRenderer.render_image = _render_image_with_alt


_README_NOTEBOOK_LINK = re.compile(r"\[`(\d\d_\w+)`\]\(notebooks/\1\.ipynb\)")


def _readme_links_to_pages(app, relative_path, parent_docname, content) -> None:
    """The README links each notebook as ``notebooks/NN_name.ipynb`` (right on GitHub). On
    the site, where the same text is included into docs/index.md, that link would name a file
    through the docs/notebooks symlink, which Sphinx resolves out of docs/ (no such page):
    it becomes a plain link to the notebook's page instead."""
    if pathlib.PurePath(relative_path).name == "README.md":
        content[0] = _README_NOTEBOOK_LINK.sub(
            r'<a href="notebooks/\1.html"><code>\1</code></a>', content[0])


def setup(app):
    app.connect("include-read", _readme_links_to_pages)
