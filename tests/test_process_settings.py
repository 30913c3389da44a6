"""What the `bertkit` command decides for its own process before torch loads (issue 41 items 2, 10)."""

import os
import subprocess
import sys

from bertkit.cli import process_settings


def test_a_passive_wait_policy_and_a_calm_bar_off_a_terminal():
    env = {}
    assert process_settings(env, terminal=False) == {"OMP_WAIT_POLICY": "PASSIVE", "TQDM_MININTERVAL": "30"}
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "TQDM_MININTERVAL": "30"}
    env = {}
    assert process_settings(env, terminal=True) == {"OMP_WAIT_POLICY": "PASSIVE"}  # a terminal redraws as usual


def test_what_the_user_set_is_kept():
    env = {"OMP_WAIT_POLICY": "ACTIVE", "TQDM_MININTERVAL": "1"}
    assert process_settings(env, terminal=False) == {} and env == {"OMP_WAIT_POLICY": "ACTIVE", "TQDM_MININTERVAL": "1"}


def test_the_settings_come_before_torch_loads():
    """The OpenMP runtime reads OMP_WAIT_POLICY once, when torch loads: `bertkit.cli` must not load torch,
    and the `bertkit` command's process has the setting in its environment when it runs a command."""
    code = ("import sys; import bertkit.cli; assert 'torch' not in sys.modules, 'bertkit.cli loads torch'; "
            "from bertkit.cli import main; sys.argv = ['bertkit', 'model', 'info']; main(); "
            "import os; print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"
