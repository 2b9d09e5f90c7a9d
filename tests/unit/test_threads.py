"""`mechopd.core.threads`: the OpenMP wait policy chosen before torch loads (issue 58), and the workers' reason line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mechopd.core.threads import POLICY, POLICY_ENV, configure, usable_cores
from mechopd.pipeline.pool import workers_why

ROOT = Path(__file__).resolve().parents[2]


def test_configure_sets_passive_when_unset():
    env: dict[str, str] = {}
    line = configure(env)
    assert env == {POLICY_ENV: POLICY} and "PASSIVE" in line and "default" in line


def test_configure_keeps_the_users_policy():
    env = {POLICY_ENV: "ACTIVE"}
    assert "set by OMP_WAIT_POLICY" in configure(env) and env == {POLICY_ENV: "ACTIVE"}


def _policy_seen_by_torch(code: str, env_policy: str | None) -> str:
    """Import `code` in a fresh interpreter; the OMP_WAIT_POLICY in the environment when torch is first imported."""
    env = {k: v for k, v in os.environ.items() if k != POLICY_ENV}
    if env_policy is not None:
        env[POLICY_ENV] = env_policy
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    probe = (
        "import os, sys\n"
        "seen = []\n"
        "class Finder:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and not seen:\n"
        "            seen.append(os.environ.get('OMP_WAIT_POLICY', 'unset'))\n"
        "        return None\n"
        "sys.meta_path.insert(0, Finder())\n"
        f"{code}\n"
        "print(seen[0] if seen else 'torch not imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


def test_cli_sets_the_policy_before_torch_loads():
    assert _policy_seen_by_torch("import mechopd.cli", None) == "PASSIVE"
    assert _policy_seen_by_torch("import mechopd.cli", "ACTIVE") == "ACTIVE"  # the user's, kept


def test_workers_why_names_the_choice():
    assert workers_why(3, 1, given=True) == "--workers 3"
    line = workers_why(2, 1)
    assert line.startswith("default: 2 = intra-op threads") and f"{usable_cores()} core(s) usable" in line
    assert "--workers N" in line


def test_passive_counts_only_where_libgomp_saw_it(monkeypatch):
    """`passive()`: the policy in the environment, unless `configure` set it after this process loaded torch."""
    import torch  # noqa: F401  (loaded: a policy set now is not this process's)

    from mechopd.core import threads

    monkeypatch.setattr(threads, "_SET_LATE", [])
    monkeypatch.setenv(POLICY_ENV, "PASSIVE")
    assert threads.passive()
    monkeypatch.setenv(POLICY_ENV, "ACTIVE")
    assert not threads.passive()
    monkeypatch.delenv(POLICY_ENV)
    assert "from the next process on" in configure()
    assert os.environ[POLICY_ENV] == POLICY and not threads.passive()
