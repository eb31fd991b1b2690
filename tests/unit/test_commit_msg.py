"""hack/commit-msg: CONTRIBUTING's rule for commit messages, as a pure
function of one message. Over a range of commits, as `.ci/run` checks
every commit since the recorded base: tests/processes/test_commit_msg.py."""

import pytest

from testsupport.commit_msg import BODY, commit_msg, loader

loader.exec_module(commit_msg)


@pytest.mark.parametrize(
    "message",
    [
        "Worker: one reservation per round",
        "Worker: one reservation per round\n",
        f"Worker: one reservation per round\n\n{BODY}",
        f"docs/benchmarks.md section 17: one run\n\n{BODY}",
        "hack/commit-msg: " + "x" * 43,
        "Docs: a long line that cannot wrap\n\n" + "https://example.com/" + "a" * 80,
        "Docs: a long line that cannot wrap\n\n  - " + "bench/" + "a" * 80,
        "Docs: a long line that cannot wrap\n\n[1]: https://example.com/" + "a" * 80,
        "Docs: two paragraphs\n\nOne.\n\nTwo, " + "y" * 67,
    ],
)
def test_messages_that_keep_the_rule(message: str) -> None:
    assert commit_msg.problems(message) == []


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("Worker: " + "x" * 53, "subject is 61 characters, more than 60"),
        ("One reservation per round", "subject is not `Area: what changed`"),
        ("The worker now does: one reservation", "subject is not `Area: what changed`"),
        ("Worker:one reservation", "subject is not `Area: what changed`"),
        ("Worker: ", "subject is not `Area: what changed`"),
        (" Worker: one reservation", "subject is not `Area: what changed`"),
        ("Worker: one reservation ", "subject is not `Area: what changed`"),
        ("", "subject is not `Area: what changed`"),
        (f"Worker: one reservation\n{BODY}", "second line is not blank"),
        ("Worker: one reservation\n\n" + "word " * 14 + "end", "line 3 is 73 characters, more than 72"),
        ("Worker: one reservation\n\nSee https://example.com/" + "a" * 60, "line 3 is"),
    ],
)
def test_messages_that_break_it_are_told_why(message: str, problem: str) -> None:
    (found,) = commit_msg.problems(message)
    assert found.startswith(problem)


def test_a_subject_may_break_both_parts_of_its_rule() -> None:
    assert len(commit_msg.problems("A sentence for a subject, " + "w" * 40)) == 2


def test_the_hook_reads_the_message_git_keeps() -> None:
    edited = (
        "Worker: one reservation\n\n"
        f"{BODY}"
        "# Please enter the commit message for your changes.\n"
        "# ------------------------ >8 ------------------------\n"
        "diff --git a/x b/x\n" + "+" + "q" * 100 + "\n"
    )
    assert commit_msg.edited(edited) == f"Worker: one reservation\n\n{BODY}".rstrip("\n")
    assert commit_msg.problems(commit_msg.edited(edited)) == []
