"""benchmarks/sanitize_attention_backward.py on the CPU: its cases cover every head_dim,
causal and not, GQA and tails of both block sizes; compute-sanitizer's summaries are read
into clean or not (hazards, errors, a missing summary, a timeout, wrong gradients), and the
closing line counts the clean cases. The sanitizer runs themselves are the lead's (GPU)."""

import subprocess
import types

import pytest

from benchmarks import sanitize_attention_backward as sanitize

RACECHECK_CLEAN = "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
RACECHECK_HAZARDS = "========= RACECHECK SUMMARY: 12 hazards displayed (12 errors, 0 warnings)\n"
MEMCHECK_CLEAN = "========= ERROR SUMMARY: 0 errors\n"
CHECK_OK = "h=2/1 seq=130x200 d=64 causal: worst relative error 3.10e-03 ok\n"
CHECK_WRONG = "h=2/1 seq=130x200 d=64 causal: worst relative error 4.00e-01 WRONG\n"


def test_the_cases_cover_every_head_dim_mask_gqa_and_tails():
    head_dims = {case[4] for case in sanitize.CASES}
    assert head_dims == {64, 128, 256}
    for head_dim in head_dims:
        cases = [case for case in sanitize.CASES if case[4] == head_dim]
        assert any(heads > kv_heads for heads, kv_heads, *_ in cases), f"d{head_dim}: no GQA case"
        assert any(seq_q % 64 and seq_k % 64 for _, _, seq_q, seq_k, _, _ in cases), f"d{head_dim}: no tails"
    assert {case[5] for case in sanitize.CASES} == {True, False}
    # head_dim 128's defaults take 128 keys a CTA: a tail of that block too
    assert any(case[4] == 128 and case[3] % 128 for case in sanitize.CASES)


@pytest.mark.parametrize("tool, output, clean, says", [
    ("racecheck", RACECHECK_CLEAN, True, "0 hazards (0 errors, 0 warnings)"),
    ("racecheck", RACECHECK_HAZARDS, False, "12 hazards (12 errors, 0 warnings)"),
    ("racecheck", "Segmentation fault\n", False, "no racecheck summary"),
    ("memcheck", MEMCHECK_CLEAN, True, "0 errors"),
    ("memcheck", "========= ERROR SUMMARY: 3 errors\n", False, "3 errors"),
])
def test_sanitizer_summaries_are_read(tool, output, clean, says):
    assert sanitize.sanitizer_verdict(tool, output) == (clean, says)


def test_gradient_check_lines_are_read():
    assert sanitize.gradients_verdict(CHECK_OK) == "ok 3.10e-03"
    assert sanitize.gradients_verdict(CHECK_WRONG) == "WRONG 4.00e-01"
    assert sanitize.gradients_verdict("h=2/1 seq=70x70 d=256 causal: no such variant, skipped (x)") == "skipped"
    assert sanitize.gradients_verdict("Traceback ...") == "-"


def _fake_runs(monkeypatch, outputs):
    """subprocess.run answering each case's sanitizer run with the next output (a str, or
    None for a timeout); returns the commands it was given."""
    commands = []

    def run(command, capture_output, text, timeout):
        commands.append(command)
        output = outputs[len(commands) - 1]
        if output is None:
            raise subprocess.TimeoutExpired(command, timeout)
        return types.SimpleNamespace(stdout=output, stderr="", returncode=0)

    monkeypatch.setattr(sanitize.subprocess, "run", run)
    return commands


def test_each_case_runs_under_the_sanitizer_and_the_summary_counts_clean_cases(monkeypatch, capsys):
    commands = _fake_runs(monkeypatch, [CHECK_OK + RACECHECK_CLEAN, CHECK_OK + RACECHECK_HAZARDS, None,
                                        CHECK_WRONG + RACECHECK_CLEAN])
    assert sanitize.main(["--tool", "racecheck", "--cases", "0,1,2,3", "--timeout", "5"]) == 1
    printed = capsys.readouterr().out
    assert [c[:3] for c in commands] == [["compute-sanitizer", "--tool", "racecheck"]] * 4
    assert [c[c.index("--cases") + 1] for c in commands] == ["0", "1", "2", "3"]
    assert "12 hazards" in printed and "timed out after 5 s" in printed
    assert printed.rstrip().endswith("racecheck: 1 of 4 cases clean")


def test_all_clean_exits_zero(monkeypatch, capsys):
    _fake_runs(monkeypatch, [CHECK_OK + MEMCHECK_CLEAN] * 2)
    assert sanitize.main(["--tool", "memcheck", "--cases", "1,4"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("memcheck: 2 of 2 cases clean")
