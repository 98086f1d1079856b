"""The lab kept out of the product: ``benchmarks/RESULTS.md`` holds today's headline tables only,
``benchmarks/results/`` only files something cites, ``scripts/gpu/plans/`` a handful of plans that
``scripts/gpu/README.md`` lists, and every results path the pages cite exists. Pure file reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
RESULTS = ROOT / "benchmarks" / "results"
PLANS = ROOT / "scripts" / "gpu" / "plans"
PAGES = [ROOT / "README.md", RESULTS_MD, ROOT / "benchmarks" / "README.md", ROOT / "scripts" / "gpu" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
# where a results file may be cited: the product, its pages and its tools (not the results folder itself)
CITING = ["README.md", "mkdocs.yml", "benchmarks", "configs", "docs", "examples", "scripts", "src", "tests"]
TEXT = {".md", ".py", ".sh", ".toml", ".yml", ".yaml", ".txt", ".json", ".cfg", ".ini", ".sbatch"}

MAX_RESULTS, MAX_PLANS, MAX_RESULTS_LINES = 40, 6, 300


def results_files() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_file())


def citing_text() -> str:
    """Every text file that may cite a results file, this test left out (it names some itself)."""
    chunks = []
    for name in CITING:
        path = ROOT / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []
        for f in files:
            if RESULTS in f.parents or f == Path(__file__).resolve() or "__pycache__" in f.parts:
                continue
            if f.suffix in TEXT or f.name == "README":
                chunks.append(f.read_text(errors="replace"))
    return "\n".join(chunks)


def test_results_md_holds_the_headline_tables_only():
    text = RESULTS_MD.read_text()
    assert len(text.splitlines()) <= MAX_RESULTS_LINES
    assert not re.findall(r"^## \(", text, re.M), "a section headed by a letter, e.g. '## (aw) ...'"


def test_pages_cite_tables_by_name_not_by_section_letter():
    letter = re.compile(r"(?<![\w`(])\((?:a[a-z]|[a-z]|a\d)\)(?!\w)|RESULTS(?:\.md)?`?,? sections? "
                        r"|\bsections? \(?(?:a[a-z]|[b-z])\)?(?=[\s,;.)-])")
    found = {page.name: letter.findall(page.read_text()) for page in PAGES}
    assert not {k: v for k, v in found.items() if v}, found


def test_every_results_file_is_cited_by_name():
    text = citing_text()
    uncited = [p.name for p in results_files() if p.name not in text]
    assert not uncited, f"benchmarks/results/ files nothing cites: {uncited}"


def test_results_hold_at_most_40_files():
    """The memory check's measured peaks live in one file (``memory-peaks.json``), not one file each."""
    assert len(results_files()) <= MAX_RESULTS, sorted(p.name for p in results_files())


def test_plans_are_few_and_listed_in_the_gpu_readme():
    plans = sorted(p.name for p in PLANS.iterdir() if p.is_file())
    assert len(plans) <= MAX_PLANS, plans
    readme = (ROOT / "scripts" / "gpu" / "README.md").read_text()
    assert not [p for p in plans if f"plans/{p}" not in readme], plans
    tools = sorted(p.name for p in PLANS.parent.iterdir() if p.is_file() and p.name != "README.md")
    assert not [t for t in tools if f"`{t}`" not in readme], tools


def test_plans_and_tools_call_only_plans_that_exist():
    for path in sorted(PLANS.parent.rglob("*")):
        if path.is_file() and path.suffix in {".sh", ".py", ".md"}:
            for name in re.findall(r"plans/([a-z0-9][\w.-]*\.sh)", path.read_text()):
                assert (PLANS / name).is_file(), f"{path.relative_to(ROOT)} names plans/{name}"


def test_every_results_path_the_pages_cite_exists():
    missing = {}
    for page in PAGES:
        cited = set(re.findall(r"results/([\w.+-]+\.(?:jsonl|json|png|txt))\b", page.read_text()))
        if gone := sorted(name for name in cited if not (RESULTS / name).is_file()):
            missing[page.name] = gone
    assert not missing, missing
