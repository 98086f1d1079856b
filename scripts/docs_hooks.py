"""MkDocs hooks (mkdocs.yml ``hooks:``): what the docs site generates at build time.

- ``configuration.md``: the configuration reference table, generated from the config model
  (``scripts/gen_config_table.py``) on every build, so the site never lists a stale key.
- ``metrics.md``: the metrics reference, generated from ``vf_rl.config.metric_catalog``
  (``scripts/gen_metrics_page.py``) on every build.
- ``index.md``: the README (the front page), its links into ``docs/`` and ``benchmarks/results/``
  rewritten for the site.
- ``results/*.png``: the benchmark plots of ``benchmarks/results/``, served beside the pages
  (``benchmarks.md`` shows them) without a copy in ``docs/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

from gen_config_table import render  # noqa: E402
from gen_metrics_page import render as render_metrics  # noqa: E402


def on_files(files, config):
    for png in sorted((ROOT / "benchmarks" / "results").glob("*.png")):
        files.append(File(f"results/{png.name}", str(png.parents[1]), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "index.md":
        readme = (ROOT / "README.md").read_text()
        return readme.replace("](docs/", "](").replace("(benchmarks/results/", "(results/")
    if page.file.src_uri == "metrics.md":
        return render_metrics(markdown)
    return render(markdown) if page.file.src_uri == "configuration.md" else markdown
