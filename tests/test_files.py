"""Scratch folders under ``$ARENA_HOME/tmp`` (``arena.files.scratch_dir``): what a killed process
left behind is removed by the next one, nothing of a live process or another host is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from arena.files import SCRATCH, _host, scratch_dir


def test_a_killed_process_folder_is_removed_by_the_next_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from arena.files import scratch_dir\n"
            "d = scratch_dir(Path(sys.argv[1]), 'train'); (Path(d.name) / 'model.bin').write_bytes(b'x')\n"
            "print(d.name, flush=True); time.sleep(60)",
            str(home),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert killed.stdout is not None
    left = Path(killed.stdout.readline().strip())
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert (left / "model.bin").is_file()  # SIGKILL: nothing cleaned up

    root = home / SCRATCH
    elsewhere = root / "train-otherhost-1-abc"  # another machine sharing the home
    elsewhere.mkdir()
    with scratch_dir(home, "train") as live, scratch_dir(home, "eval") as second:
        assert Path(live).parent == root and Path(live).name.startswith(f"train-{_host()}-{os.getpid()}-")
        assert not left.exists()
        assert Path(live).is_dir() and Path(second).is_dir()  # this process is alive: kept
        assert elsewhere.is_dir()
    assert sorted(p.name for p in root.iterdir()) == [elsewhere.name]
