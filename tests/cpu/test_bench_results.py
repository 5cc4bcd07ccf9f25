"""bench/results holds the rows behind BENCHMARKS.md's current tables, and only those: every file
there is cited by a section that is not superseded (nor the history), and every file such a section
cites is there. Older rows stay in git (BENCHMARKS.md's History says where)."""
import itertools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
# `bench/results/NAME` or, after one such citation, the short form `...-COMMIT-rest.jsonl`
_CITED = re.compile(r"bench/results/([\w.{},-]+)|`\.\.\.(-[\w.{},-]+)`")


def _expand(name: str) -> list[str]:
    """run{1,2,3}.jsonl -> run1.jsonl, run2.jsonl, run3.jsonl"""
    parts = re.split(r"\{([^}]*)\}", name)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _current_sections(text: str) -> list[tuple[str, str]]:
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    out = []
    for section in sections:
        heading = section.splitlines()[0]
        if "superseded" in heading or heading.startswith("History") or "prototypes" in heading:
            continue
        out.append((heading, section))
    return out


def cited() -> dict[str, str]:
    """File name -> heading of the current section citing it."""
    out = {}
    for heading, section in _current_sections((REPO / "BENCHMARKS.md").read_text()):
        prefix = None
        for m in _CITED.finditer(section):
            if m.group(1):
                name = m.group(1).rstrip(".,")
                prefix = re.match(r"\d{4}-\d\d-\d\d-[a-z0-9]+", name)
            elif prefix:
                name = prefix.group(0) + m.group(2)
            else:
                continue
            for n in _expand(name):
                out[n] = heading
    return out


def test_every_result_file_is_cited_by_a_current_table():
    files = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md")
    uncited = [f for f in files if f not in cited()]
    assert not uncited, f"not cited by any current BENCHMARKS.md section (move them to git history): {uncited}"


def test_every_file_a_current_table_cites_is_there():
    missing = {name: heading for name, heading in cited().items() if not (RESULTS / name).is_file()}
    assert not missing, missing
