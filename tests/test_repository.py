"""The repository stands alone: no file of the project points to a path outside it (a clone has
none of them), and the README stays a page a newcomer reads in minutes (the rest is in docs/)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what a clone holds that is not the project's: environments, peers' sources, caches
NOT_OURS = {".git", ".venv", ".ext", ".device", ".hypothesis", ".fuzz", ".ruff_cache",
            ".pytest_cache", "__pycache__", "build"}
TEXT = {".py", ".md", ".toml", ".txt", ".cfg", ".sh", ""}
# paths of the machines the project grew on, never of a clone
OUTSIDE = ("../shared", ".device/setup.sh", "/work/", "/srv/", "/home/")
README_MAX_LINES = 150


def _project_files():
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if path.is_file() and path.suffix in TEXT and not NOT_OURS.intersection(parts) and not any(
                p.endswith(".egg-info") for p in parts):
            yield path


def test_no_file_points_outside_the_repository():
    this = Path(__file__).resolve()
    found = [f"{path.relative_to(ROOT)}: {needle}" for path in _project_files() if path != this
             for needle in OUTSIDE if needle in path.read_text(errors="replace")]
    assert not found, found


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    for doc in ("docs/math.md", "docs/api.md", "docs/harness.md", "docs/benchmarks.md",
                "docs/gpu.md"):
        assert f"({doc})" in readme and (ROOT / doc).is_file(), doc
