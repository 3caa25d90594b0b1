"""The README's two commands are the project's contract; CI must run the test one verbatim."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    return [line.strip() for b in blocks[:2] for line in b.splitlines() if line.strip()]


def test_readme_opens_with_two_commands():
    main_cmd, test_cmd = readme_commands()[:2]
    assert "scripts/setup.sh" in main_cmd and "gatherlens" in main_cmd
    assert "scripts/setup.sh --test" in test_cmd and "pytest" in test_cmd


def test_ci_runs_the_readme_test_command():
    test_cmd = readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_cmd in ci.splitlines()
