"""Runs a scenario inside the guest and reports each step on the console.

Every step is a shell command; after it the runner reports, as one line
``MARK step <json>``: its rc, output tails, duration, the kernel log lines it
caused (dmesg), and the loaded modules (/proc/modules). The host parses those
lines. Human-readable copies of the same are printed above each MARK line.
"""

import json
import os
import subprocess
import sys
import time

TAIL = 48000  # an install logs ~40 JSON events; its plan_ready must stay in the tail


def dmesg_lines():
    cp = subprocess.run(["dmesg"], capture_output=True, text=True, errors="replace")
    return cp.stdout.splitlines()


def proc_modules():
    try:
        with open("/proc/modules") as f:
            return f.read()
    except OSError as exc:
        return f"error: {exc}"


def _text(data):
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def say(line=""):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(path):
    with open(path) as f:
        scenario = json.load(f)
    base_env = dict(os.environ)
    base_env.update(scenario.get("env", {}))
    seen = len(dmesg_lines())
    say("MARK scenario " + json.dumps({"name": scenario.get("name"), "steps": len(scenario["steps"])}))
    for step in scenario["steps"]:
        name = step["name"]
        env = dict(base_env)
        env.update(step.get("env", {}))
        say(f"===== step {name}: {step['sh']}")
        t0 = time.monotonic()
        try:
            cp = subprocess.run(
                ["/bin/sh", "-c", step["sh"]],
                capture_output=True,
                text=True,
                errors="replace",
                env=env,
                timeout=step.get("timeout", 600),
                stdin=subprocess.DEVNULL,
            )
            rc, out, err = cp.returncode, cp.stdout, cp.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            out = (
                (exc.stdout or b"").decode(errors="replace")
                if isinstance(exc.stdout, bytes)
                else (exc.stdout or "")
            )
            err = (
                (exc.stderr or b"").decode(errors="replace")
                if isinstance(exc.stderr, bytes)
                else (exc.stderr or "")
            )
        dt = round(time.monotonic() - t0, 2)
        lines = dmesg_lines()
        new = lines[seen:]
        seen = len(lines)
        for ln in out[-4000:].splitlines():
            say(f"  out| {ln}")
        for ln in err[-4000:].splitlines():
            say(f"  err| {ln}")
        for ln in new:
            say(f"  dmesg| {ln}")
        say(f"----- step {name}: rc={rc} in {dt}s")
        record = {
            "name": name,
            "rc": rc,
            "seconds": dt,
            "stdout": out[-TAIL:],
            "stderr": err[-TAIL:],
            "dmesg": new,
            "modules": proc_modules(),
        }
        say("MARK step " + json.dumps(record))
    say("MARK scenario-done")


if __name__ == "__main__":
    main(sys.argv[1])
