"""The ``dpro`` console command: a cached ``dpro replay PATH --json`` answered before the CLI loads.

A cache hit of the full CLI costs more in imports (click, dpro.cli and what it imports: ~0.1 s)
than in work. So :func:`main` first reads the command line itself, and only for the plain form

    dpro [--allow-missing-ranks] [--max-input-bytes SIZE] replay PATH --json
         [--no-expand] [--no-align] [--rank-pattern REGEX]

computes the result's key (:func:`dpro.resultcache.result_key`, the function the full CLI uses)
and prints the stored bytes when there are some. Everything else (a miss, any other command or
option, ``--no-cache``, ``-v``, a damaged entry, an error) runs the full CLI, unchanged.
"""

# (no ``from __future__ import annotations``: see dpro.resultcache)
import os
import sys

#: the options of ``replay`` the fast path knows -> the name of their value (None: a flag)
_REPLAY_OPTS = {"--json": None, "--no-expand": None, "--no-align": None, "--rank-pattern": "rank_pattern"}
#: the group options before ``replay`` it knows
_GROUP_OPTS = {"--allow-missing-ranks": None, "--max-input-bytes": "max_input_bytes"}
#: the defaults of the full CLI (``dpro.importers.kineto.read.DEFAULT_RANK_PATTERN``,
#: ``dpro.sizes.DEFAULT_MAX_INPUT`` and its bytes), spelled here not to import those modules
#: (tests/test_entry.py checks they agree)
DEFAULT_RANK_PATTERN = r"rank[-_]?(\d+)"
DEFAULT_MAX_INPUT = "2GiB"
DEFAULT_MAX_INPUT_BYTES = 2 * 2**30


def parse_plain_replay(argv: list[str]) -> dict | None:
    """The options of ``argv`` (the arguments after ``dpro``) when it is the plain form of
    ``replay --json`` (see the module's docstring), else None. An option given twice, a value
    that looks like an option, or anything unknown is None: the full CLI decides."""
    if "replay" not in argv:
        return None
    cut = argv.index("replay")
    seen: dict[str, str | None] = {}
    path = None
    for part, known in ((argv[:cut], _GROUP_OPTS), (argv[cut + 1:], _REPLAY_OPTS)):
        it = iter(part)
        for arg in it:
            name, eq, value = arg.partition("=")
            if not arg.startswith("-"):
                if known is _GROUP_OPTS or path is not None:
                    return None
                path = arg
                continue
            if name not in known or name in seen or (eq and known[name] is None):
                return None
            if known[name] is not None and not eq:
                value = next(it, None)
                if value is None or value.startswith("-"):
                    return None
            seen[name] = value if known[name] is not None else None
    if path is None or "--json" not in seen:
        return None
    size = seen["--max-input-bytes"] if "--max-input-bytes" in seen else \
        os.environ.get("DPRO_MAX_INPUT_BYTES") or DEFAULT_MAX_INPUT  # click: an empty variable is unset
    if "--allow-missing-ranks" not in seen and os.environ.get("DPRO_ALLOW_MISSING_RANKS"):
        return None  # click's reading of the variable (1, true, yes, on, ...): left to it
    return {"path": path, "expand_collectives": "--no-expand" not in seen, "align": "--no-align" not in seen,
            "rank_pattern": seen.get("--rank-pattern") or DEFAULT_RANK_PATTERN,  # as dpro.job's
            "max_input_bytes": size,
            "allow_missing_ranks": "--allow-missing-ranks" in seen}


def cached_replay(argv: list[str]) -> bytes | None:
    """What ``dpro ARGV`` prints when it is a cached plain ``replay --json`` (else None)."""
    from dpro import resultcache as rc

    a = parse_plain_replay(argv)
    if a is None or not rc.enabled_by_default():
        return None
    root = rc.default_dir()
    if not os.path.exists(a["path"]) or rc.inside(root, a["path"]):
        return None
    if a["max_input_bytes"] == DEFAULT_MAX_INPUT:
        limit = DEFAULT_MAX_INPUT_BYTES
    else:
        from dpro.errors import DproInputError
        from dpro.sizes import parse_size

        try:
            limit = parse_size(a["max_input_bytes"], "--max-input-bytes")
        except DproInputError:
            return None
    key = rc.result_key(a["path"], "replay", {"expand_collectives": a["expand_collectives"], "align": a["align"]},
                        rank_pattern=a["rank_pattern"], engine=os.environ.get("DPRO_ENGINE", ""),
                        read={"max_input_bytes": limit, "allow_missing_ranks": a["allow_missing_ranks"]})
    if key is None:
        return None
    try:
        return rc.ResultStore(root).load(key)
    except (OSError, ValueError):
        return None  # the full CLI says why


def _write(data: bytes) -> bool:
    """Write ``data`` to stdout; False when nothing could be written (the full CLI then runs and
    reports the problem its way), else True or the exit of the full CLI's error handling."""
    view, done = memoryview(data), 0
    try:
        while done < len(data):
            done += os.write(sys.stdout.fileno(), view[done:])
    except OSError as e:
        if done == 0:
            return False
        if isinstance(e, BrokenPipeError):
            sys.exit(1)
        sys.stderr.write(f"dpro: error: {e.strerror or e}\n")
        sys.exit(2)
    return True


def main() -> None:
    """The ``dpro`` command (``[project.scripts]``, ``python -m dpro``)."""
    try:
        data = cached_replay(sys.argv[1:])
    except Exception:  # noqa: BLE001 - the fast path is an optimisation: any surprise runs the full CLI
        data = None
    if data is not None and _write(data):
        return
    from dpro.cli import main as cli_main

    cli_main()
