"""hack/commit-msg over a range of commits of a real repository, as
`.ci/run` checks every commit since the recorded base."""

import subprocess

from testsupport.commit_msg import BODY, commit_msg


def test_a_range_is_checked_commit_by_commit_without_its_merges(tmp_path, monkeypatch, capsys) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "t")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "t")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@example.com")
    git("init", "-q", "-b", "main")
    git("commit", "-q", "--allow-empty", "-m", "the base, before the rule")
    base = git("rev-parse", "HEAD")
    git("checkout", "-q", "-b", "side")
    git("commit", "-q", "--allow-empty", "-m", f"Side: a change\n\n{BODY}")
    git("checkout", "-q", "main")
    git("commit", "-q", "--allow-empty", "-m", "Main: another change")
    git("merge", "-q", "--no-ff", "--no-edit", "side")
    assert commit_msg.check_range(f"{base}..HEAD") == 0
    git("commit", "-q", "--allow-empty", "-m", "a subject without its area")
    assert commit_msg.check_range(f"{base}..HEAD") == 1
    assert "a subject without its area" in capsys.readouterr().out
