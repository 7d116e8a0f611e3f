"""On a spot (preemptible) cloud machine: the cloud's notice, turned into the course's stop signal.

    python -m trainup.spot --cloud aws -- python scripts/_trainup_cpu.py --resume
    python -m trainup.spot --cloud gcp -- torchrun --nproc-per-node 2 \\
        scripts/_trainup_ddp.py --resume

The command starts in a process group of its own. The watcher asks the cloud's metadata service
every few seconds whether the machine is being taken back; on a notice it sends SIGTERM (or
--signal) to the whole group, as SLURM signals all of a job's processes: every rank finishes its
step, rank 0 saves where the run is inside the epoch, and the ranks exit 75 (STOPPED_EXIT). The
watcher exits with the command's status: 75 from a script run as one process (or as srun's ranks);
torchrun, signalled with its workers, reports their stop as a failure of its own (1), and the
run's log says "stopped". On the next machine the same line, with --resume, goes on from that
step. SIGTERM and SIGINT (Ctrl-C) sent to the watcher go on to the group, as without it.

The services answer on the cloud's machine only:
- AWS EC2 Spot: GET /latest/meta-data/spot/instance-action answers 404 until the instance is
  marked, then {"action": "terminate" | "stop" | "hibernate", "time": "...Z"}, two minutes ahead
  (hibernation: at once); AWS advises asking every 5 s. IMDSv2, which new instances require,
  first wants a token: PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds, sent back
  as X-aws-ec2-metadata-token. docs.aws.amazon.com/AWSEC2/latest/UserGuide/
  spot-instance-termination-notices.html and .../configuring-instance-metadata-service.html
- Google Cloud (Spot and preemptible VMs): GET /computeMetadata/v1/instance/preempted with the
  header Metadata-Flavor: Google answers FALSE, and TRUE once preemption starts, 30 s before the
  VM stops. cloud.google.com/compute/docs/instances/create-use-spot (detecting preemption) and
  .../instances/spot (the preemption process)

The watcher asks once before it starts the command. Where no service answers (another machine, or
a container that cannot reach it: on EC2, IMDSv2's default hop limit of 1 keeps Docker's bridge
network out) it says so in one sentence and runs the command all the same: the run is worth doing
unwatched. It keeps asking, so that a service that answers later still delivers its notice (an
on-demand machine answers "no notice" for ever). A notice already there: the command is not
started (exit 75), since a run stopped before its Stopper is set would die, not save.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

from . import UserError

BASES = {"aws": "http://169.254.169.254", "gcp": "http://metadata.google.internal"}
SIGNALS = ("TERM", "USR1", "USR2", "HUP")  # the scripts stop on SIGTERM, or their --stop-signal
TIMEOUT_S = 2  # the service is on the machine's own link: it answers in milliseconds, or never
STOPPED_EXIT = 75  # preempt's (not imported: preempt loads torch, which the watcher never needs)


def _get(url, method="GET", **headers):
    request = urllib.request.Request(url, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        return answer.read().decode()


def aws(base):
    """The notice in words, or None. A token for each ask: no expiry to track."""
    token = _get(f"{base}/latest/api/token", "PUT",
                 **{"X-aws-ec2-metadata-token-ttl-seconds": "60"})
    try:
        body = _get(f"{base}/latest/meta-data/spot/instance-action",
                    **{"X-aws-ec2-metadata-token": token})
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 404:  # not marked (yet)
            return None
        raise
    try:  # the item exists: a notice, whatever it holds; its JSON says what comes, and when
        action = json.loads(body)
        return f"{action['action']} at {action['time']}"
    except (ValueError, KeyError, TypeError):
        return body.strip()[:80] or "instance-action"


def gcp(base):
    answer = _get(f"{base}/computeMetadata/v1/instance/preempted", **{"Metadata-Flavor": "Google"})
    return "preempted, the VM stops in 30 s" if answer.strip() == "TRUE" else None


ASK = {"aws": aws, "gcp": gcp}


class Parser(argparse.ArgumentParser):
    def error(self, message):  # as trainup.cli's (not imported: it loads torch): one sentence
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse(argv=None):
    p = Parser(prog="python -m trainup.spot", description=__doc__.split("\n\n")[0])
    p.add_argument("--cloud", required=True, choices=sorted(ASK), help="whose notices to watch")
    p.add_argument("--signal", default="TERM", choices=SIGNALS,
                   help="sent to the group on a notice: TERM (torchrun's agent handles it too), "
                        "or the scripts' --stop-signal")
    p.add_argument("--every", type=float, default=5.0, help="seconds between asks (AWS: 5)")
    # The services exist on the cloud's machines only: a drill anywhere else (notebook 04c,
    # tests/test_spot.py) points the watcher at a stand-in that answers as the cloud's does.
    p.add_argument("--metadata-url", help="the metadata service's base URL (default: the cloud's)")
    p.add_argument("command", nargs="*", help="the command to run and watch, after --")
    args = p.parse_args(argv)
    if not args.command:
        p.error("no command to watch: give it after --, e.g. -- python scripts/_trainup_cpu.py")
    if not shutil.which(args.command[0]):
        p.error(f"{args.command[0]!r}: no such command (not on PATH, or not executable)")
    if not args.every > 0:
        p.error(f"--every must be a number of seconds above 0, got {args.every}")
    base = (args.metadata_url or BASES[args.cloud]).rstrip("/")
    if not base.startswith(("http://", "https://")):
        p.error(f"--metadata-url must start with http:// or https://, got {args.metadata_url!r}")
    return argparse.Namespace(**vars(args), base=base)


def say(sentence):
    print(f"spot: {sentence}", file=sys.stderr, flush=True)


def to_group(child, signum):
    if child.returncode is None:  # not once reaped: by then its group id may be another's
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:  # the group ended meanwhile
            pass


def ask(args, first=False):
    """The notice in words, or None. Only the first ask says that no service answers."""
    try:
        return ASK[args.cloud](args.base)
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts too
        if first:
            say(f"{args.cloud}'s metadata service does not answer at {args.base} ({e}): this is "
                f"not one of its machines, or one that cannot reach it; the command runs, but no "
                f"notice can stop it")
        return None


def watch(args, child, done, noticed):
    """Ask every few seconds until a notice (then signal the group) or the command's end."""
    while not done.wait(args.every):
        notice = ask(args)
        if notice:
            noticed.set()
            to_group(child, getattr(signal, f"SIG{args.signal}"))
            say(f"notice from {args.cloud}: {notice}; sent SIG{args.signal} to process group "
                f"{child.pid}")
            return


def main(argv=None):
    args = parse(argv)
    notice = ask(args, first=True)
    if notice:
        say(f"notice from {args.cloud}: {notice}; the command is not started on a machine "
            f"that is going away")
        return STOPPED_EXIT
    try:
        child = subprocess.Popen(args.command, start_new_session=True)
    except OSError as e:
        raise UserError(f"cannot start {args.command[0]!r}: {e.strerror}") from None
    for s in (signal.SIGTERM, signal.SIGINT):  # the terminal's Ctrl-C reaches this process alone
        signal.signal(s, lambda signum, frame: to_group(child, signum))
    say(f"watching {args.base} for {args.cloud}'s notice every {args.every:g} s; "
        f"the command is process group {child.pid}")
    done, noticed = threading.Event(), threading.Event()
    threading.Thread(target=watch, args=(args, child, done, noticed), daemon=True).start()
    code = child.wait()  # the thread asks meanwhile; this (main) thread handles the signals
    done.set()
    if code == STOPPED_EXIT:
        say("the command stopped with a checkpoint (exit 75): run it again with --resume")
    elif code and noticed.is_set():  # torchrun's 1: its agent was signalled with its workers
        say(f"the command exited {code} after the notice: rank 0's sentence above says whether "
            f"the run saved where it was (torchrun reports its workers' stop as its own failure)")
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
