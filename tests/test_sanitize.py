"""properties/sanitize.py on the CPU: reading compute-sanitizer's reports, attributing them to a
kernel and its source lines, explaining them by a rule, and failing on anything else."""

import pytest

from properties import sanitize
from properties.sanitize import Explained, Outcome, parse, table

LINE = "ct.store(dA_cumsum, (i_b, i_hb, i_c, 0)"  # one line of kernels/chunk_cumsum.py


def _where(text=LINE, path="kernels/chunk_cumsum.py"):
    return Explained("initcheck", "_chunk_cumsum_kernel", path, text, "Uninitialized", "x").where()


def initcheck_output(where: str, n: int = 2, total: int | None = None) -> str:
    block = ("========= Uninitialized __global__ memory read of size 4 bytes\n"
             f"=========     at _chunk_cumsum_kernel_Kt2_A4f32_7v4l0_8t1_p16_I64+0x1790 in {where}\n"
             "=========     by thread (96,0,0) in block (0,0,1)\n"
             "=========     Address 0x7fc8368806fc\n"
             "========= \n")
    return ("========= COMPUTE-SANITIZER\n" + block * n + "some program output\n"
            f"========= ERROR SUMMARY: {n if total is None else total} errors\n")


RACECHECK = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at _ssd_varlen_kernel_Kt2_A4f32+0x3330 in ssd_varlen.py:90
=========     and Write access at _ssd_varlen_kernel_Kt2_A4f32+0x3330 in ssd_varlen.py:90 [5248 hazards]
========= 
========= Error: Race reported between Write access at _ssd_varlen_kernel_Kt2_A4f32+0x3330 in ssd_varlen.py:90
=========     and Read access at _ssd_varlen_kernel_Kt2_A4f32+0x3400 in ssd_varlen.py:95 [12 hazards]
========= 
========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)
"""


def test_initcheck_reports_name_kernel_line_and_total():
    reports, total = parse("initcheck", initcheck_output("chunk_cumsum.py:93"))
    assert total == 2
    assert [(r.kind, r.kernel, r.where) for r in reports] == [
        ("Uninitialized __global__ memory read of size 4 bytes", "_chunk_cumsum_kernel",
         ("chunk_cumsum.py:93",))] * 2


def test_racecheck_report_names_both_accesses():
    reports, total = parse("racecheck", RACECHECK)
    assert total == 2
    assert [(r.kind, r.kernel, r.where) for r in reports] == [
        ("Error: Race reported between Write access and Write access", "_ssd_varlen_kernel",
         ("ssd_varlen.py:90",)),
        ("Error: Race reported between Write access and Read access", "_ssd_varlen_kernel",
         ("ssd_varlen.py:90", "ssd_varlen.py:95"))]


def test_the_async_copy_rule_explains_a_write_write_race_at_its_line_only():
    """The shipped rule for ssd_varlen's dt gather: the two writes at its line are explained;
    a write racing a read there, or a write race at another line, is not."""
    rule = next(r for r in sanitize.EXPLAINED if r.kernel == "_ssd_varlen_kernel")
    line = rule.where()
    reports, total = parse("racecheck", RACECHECK.replace("ssd_varlen.py:90", line))
    _, problems = table([Outcome("racecheck", 0, 0, reports, total, 1.0, "")])
    assert problems == [f"racecheck call 0: 1 unexplained: Error: Race reported between Write "
                        f"access and Read access in _ssd_varlen_kernel at {line}, "
                        f"ssd_varlen.py:95"]
    moved = RACECHECK.replace("ssd_varlen.py:90", "ssd_varlen.py:1")
    reports, total = parse("racecheck", moved)
    _, problems = table([Outcome("racecheck", 0, 0, reports, total, 1.0, "")])
    assert len(problems) == 2


def test_a_rule_follows_its_line_and_refuses_a_changed_one():
    assert _where().startswith("chunk_cumsum.py:")
    with pytest.raises(ValueError, match="occurs 0 times"):
        _where("this text is in no kernel")
    with pytest.raises(ValueError, match="times in"):
        _where("ct.load(")  # many lines: a rule must name one
    with pytest.raises(ValueError, match="no function"):
        Explained("initcheck", "_no_such_kernel", "kernels/chunk_cumsum.py", LINE, "U",
                  "x").where()


def test_only_the_rules_reports_are_explained():
    where = _where()
    rule = Explained("initcheck", "_chunk_cumsum_kernel", "kernels/chunk_cumsum.py", LINE,
                     "Uninitialized __global__", "reason")
    reports, total = parse("initcheck", initcheck_output(where))
    outcome = Outcome("initcheck", 3, 0, reports, total, 1.0, "")
    text, problems = table([outcome], rules=(rule,))
    assert problems == []
    assert "_chunk_cumsum_kernel" in text and text.splitlines()[1].split()[-2:] == ["2", "2"]
    # another line of the same kernel, another tool, another kernel: not explained
    line = int(where.split(":")[1])
    for changed in (initcheck_output(f"chunk_cumsum.py:{line + 1}"),
                    initcheck_output(where).replace("_chunk_cumsum_kernel", "_ssd_scan_kernel")):
        reports, total = parse("initcheck", changed)
        _, problems = table([Outcome("initcheck", 3, 0, reports, total, 1.0, "")], (rule,))
        assert problems and "2 unexplained" in problems[0], problems
    reports, total = parse("racecheck", initcheck_output(where))
    _, problems = table([Outcome("racecheck", 3, 0, reports, total, 1.0, "")], (rule,))
    assert problems and "unexplained" in problems[0]


def test_hidden_reports_a_failed_process_and_a_missing_summary_fail():
    where = _where()
    rule = Explained("initcheck", "_chunk_cumsum_kernel", "kernels/chunk_cumsum.py", LINE,
                     "Uninitialized", "reason")
    reports, total = parse("initcheck", initcheck_output(where, n=2, total=500))
    _, problems = table([Outcome("initcheck", 0, 0, reports, total, 1.0, "")], (rule,))
    assert problems == ["initcheck call 0: 500 reports, 2 printed (the rest unexplained)"]
    reports, total = parse("memcheck", initcheck_output(where, n=0))
    _, problems = table([Outcome("memcheck", 1, 1, reports, total, 1.0, "Traceback ...")], ())
    assert len(problems) == 1 and "the process failed (1)" in problems[0]
    _, problems = table([Outcome("synccheck", 2, -1, [], None, 1.0, "(timed out)")], ())
    assert any("printed no summary" in p for p in problems)


def test_without_a_gpu_it_says_why(capsys):
    if sanitize.sanitizer_path() is not None:
        from kernels.arrays import gpu_available
        if gpu_available():
            pytest.skip("this machine has a GPU and compute-sanitizer")
    assert sanitize.main([]) == 2
    assert "needs" in capsys.readouterr().err


def test_every_rule_names_one_line_and_a_decisions_section():
    from pathlib import Path
    decisions = (Path(__file__).parent.parent / "benchmarks" / "DECISIONS.md").read_text()
    for rule in sanitize.EXPLAINED:
        assert rule.tool in sanitize.TOOLS
        rule.where()
        assert f"## {rule.reason}" in decisions, rule


def test_every_artefact_case_names_one_line_and_a_decisions_section():
    from pathlib import Path
    from properties import artefacts
    decisions = (Path(__file__).parent.parent / "benchmarks" / "DECISIONS.md").read_text()
    for case in artefacts.CASES:
        assert case.tool in sanitize.TOOLS
        artefacts._line_of(case.line)
        assert f"## {case.section}" in decisions, case
    # every rule's reason is shown by a case of the same tool
    shown = {(c.tool, c.section) for c in artefacts.CASES}
    assert all((r.tool, r.reason) in shown for r in sanitize.EXPLAINED)
