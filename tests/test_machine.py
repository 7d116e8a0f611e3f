"""lessons.machine.training_processes, lesson 00's ghost finder: this user's runs of this
checkout's scripts, not another clone's (a second checkout's run is not this notebook's to end)."""

import subprocess
import sys

from lessons import machine


def test_only_this_checkouts_course_scripts_are_ghosts(tmp_path):
    procs = []
    for name in ("mine", "other"):
        (tmp_path / name / "scripts").mkdir(parents=True)
        (tmp_path / name / "scripts" / "_trainup_x.py").write_text("import time\ntime.sleep(60)\n")
        procs.append(
            subprocess.Popen([sys.executable, "scripts/_trainup_x.py"], cwd=tmp_path / name)
        )
    try:
        mine = {p.pid for p in machine.training_processes(root=tmp_path / "mine")}
        assert procs[0].pid in mine and procs[1].pid not in mine
        # the course's own
        assert not {p.pid for p in procs} & {p.pid for p in machine.training_processes()}
    finally:
        for p in procs:
            p.kill()
            p.wait()
