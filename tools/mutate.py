"""Mutation check: put one-line bugs into the scripts, one at a time, and see whether a fast test
fails. Not run in CI (about an hour on 2 cores); its last result is in benchmarks/README.md.

    python tools/mutate.py                          # every mutation
    python tools/mutate.py --only gae-lambda rollout-last-bootstrap
    python tools/mutate.py --list                   # the mutations, without running them

Each mutation (tools/mutations.txt) is a line of a script replaced by a wrong one (the original
must occur exactly once in its file). For each, the working tree is copied to a temporary folder,
the mutation applied, and the fast tests run there (`pytest -m "not slow" -x`): first the tests
named beside it, where it is likely to be caught, then, if those all pass, the whole fast suite.
A mutation that no fast test fails survived. The table goes to stdout as markdown (with
--output, to a file too).
"""

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MUTATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mutations.txt")


def read_mutations(path: str) -> list[dict]:
    """The entries of mutations.txt: name, script, the tests to try first, and (line, bug) pairs."""
    mutations = []
    with open(path) as file:
        for line in file.read().splitlines():
            if line.startswith("## "):
                name, script, tests = line[3:].split()
                mutations.append({"name": name, "script": script, "tests": tests, "pairs": []})
            elif line.startswith("- "):
                mutations[-1]["pairs"].append([line[2:], None])
            elif line.startswith("+ "):
                mutations[-1]["pairs"][-1][1] = line[2:]
    return mutations


def copy_tree(destination: str):
    """The working tree as git sees it (tracked and untracked files it does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    for path in listed:
        if os.path.isfile(os.path.join(ROOT, path)):
            os.makedirs(os.path.join(destination, os.path.dirname(path)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, path), os.path.join(destination, path))


def first_failure(folder: str, tests: list[str], workers: int) -> str | None:
    """The first fast test that fails in folder, or None if all pass."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-x",
        "-m",
        "not slow",
        "-p",
        "no:cacheprovider",
    ]
    command += ["-n", str(workers), *tests]
    # A session of its own: -x stops pytest at the first failure, and a torchrun job that a
    # stopped worker had started would run on into the next mutation's tests. Its group goes too.
    proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    stdout, _ = proc.communicate()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", stdout, re.MULTILINE)
    if failed:
        return failed.group(1)
    if proc.returncode not in (0, 5):  # 5: no tests collected
        return f"pytest exit code {proc.returncode}"
    return None


def run(mutation: dict, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        copy_tree(folder)
        path = os.path.join(folder, f"{mutation['script']}.py")
        with open(path) as file:
            text = file.read()
        for original, bug in mutation["pairs"]:
            text = text.replace(original, bug)
        with open(path, "w") as file:
            file.write(text)
        start = time.time()
        killer = first_failure(folder, [mutation["tests"]], workers)
        if killer is None:  # not caught where expected: the whole fast suite
            killer = first_failure(folder, [], workers)
    return {**mutation, "killed_by": killer, "seconds": time.time() - start}


def check(mutations: list[dict]):
    for mutation in mutations:
        with open(os.path.join(ROOT, f"{mutation['script']}.py")) as file:
            text = file.read()
        for original, bug in mutation["pairs"]:
            if text.count(original) != 1 or bug is None:
                count, script = text.count(original), mutation["script"]
                raise SystemExit(f"error: {mutation['name']}: {count} times in {script}.py")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="names of the mutations to run")
    parser.add_argument("--list", action="store_true", help="list the mutations and stop")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers")
    parser.add_argument("--output", help="also write the markdown table here")
    options = parser.parse_args()
    mutations = [
        m for m in read_mutations(MUTATIONS) if not options.only or m["name"] in options.only
    ]
    check(mutations)
    if options.list:
        for mutation in mutations:
            print(f"{mutation['name']} ({mutation['script']}.py):")
            for original, bug in mutation["pairs"]:
                print(f"  - {original}\n  + {bug}")
        return
    rows = []
    for mutation in mutations:
        rows.append(run(mutation, options.workers))
        row = rows[-1]
        verdict = f"killed by {row['killed_by']}" if row["killed_by"] else "SURVIVED"
        print(f"{row['name']}: {verdict} ({row['seconds']:.0f} s)", flush=True)
    killed = sum(1 for row in rows if row["killed_by"])
    table = [f"{killed} of {len(rows)} mutations killed.", "", "| mutation | script | killed by |"]
    table.append("|---|---|---|")
    for row in rows:
        table.append(
            f"| {row['name']} | {row['script']}.py | {row['killed_by'] or '**survived**'} |"
        )
    print("\n".join(table))
    if options.output:
        with open(options.output, "w") as file:
            file.write("\n".join(table) + "\n")


if __name__ == "__main__":
    main()
