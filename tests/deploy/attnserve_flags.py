"""attnserve's flags: `attnserve --help` parsed, values checked against the flags' types, and the
effective values (and ports) of one place that runs attnserve.

Part of check_manifests.py, whose header says what is checked.
"""
import difflib
import os
import re
import subprocess
import sys

from checker import PROG, whole

# attnserve reads environment variables with this prefix only as its flags' (Env:...) names: any
# other ATTNSERVE_ variable is a typo that attnserve would silently ignore.
ENV_PREFIX = "ATTNSERVE_"


# ------------------------------------------------------------------------------------------------
# attnserve --help.

# `  --name TYPE=default (Env:NAME)` then padding and the description (or the description on the
# next line). TYPE is CLI11's: TEXT, INT:POSITIVE, FLOAT:FLOAT in [0 - 3600], TEXT:{a,b}.
OPTION_LINE = re.compile(
    r"^  (?:-\w,)?--(?P<name>[a-z0-9][a-z0-9-]*)"
    r"(?: (?P<type>[A-Z]+(?::(?:\{[^}]*\}|[A-Z]+(?: in \[[^\]]*\])?))?))?"
    r"(?:=(?P<default>\S*))?"
    r"(?: \(Env:(?P<env>\w+)\))?"
    r"(?=\s|$)")


class Flag:
    def __init__(self, name, type_, default, env):
        self.name, self.type, self.default, self.env = name, type_ or "", default, env

    def takes_value(self):
        return bool(self.type) or self.name == "config"


class Flags(dict):
    """{name: Flag} of one attnserve binary, which can also be asked to parse a command line."""

    def __init__(self, binary):
        super().__init__()
        self.binary = binary

    def run_help(self, args=(), env=None):
        """(exit status, stdout, stderr) of `attnserve ARGS --help` with only ENV's ATTNSERVE_*.

        CLI11 converts and validates every value (command line and environment) before it acts
        on --help, so exit 0 means attnserve itself accepts them."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        clean.update({k: str(v) for k, v in (env or {}).items() if v is not None})
        try:
            result = subprocess.run([self.binary, *args, "--help"], capture_output=True,
                                    text=True, timeout=20, env=clean, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            sys.exit(f"{PROG}: FAIL: cannot run {self.binary} --help: {error}")
        return result.returncode, result.stdout, result.stderr.strip()


def read_help(flags):
    status, out, err = flags.run_help()
    if status != 0:
        sys.exit(f"{PROG}: FAIL: {flags.binary} --help exited {status}: {err}")
    return out


def description_column(text):
    """Where CLI11 starts descriptions: the column of --help's own one."""
    match = re.search(r"^(  -h,--help +)\S", text, re.MULTILINE)
    return len(match[1]) if match else 30


def option_match(line, column):
    """OPTION_LINE's match if it spans the whole name column (nothing unexpected after it)."""
    match = OPTION_LINE.match(line)
    if match is None:
        return None
    end = match.end()
    if line[end:].strip() == "" or (end < column and line[end:column].strip() == ""
                                    and line[column:column + 1].strip()):
        return match
    return None


def parse_help(flags, check):
    text = read_help(flags)
    column = description_column(text)
    for line in text.splitlines():
        if not re.match(r"^  (?:-\w,)?--", line):
            continue
        match = option_match(line, column)
        if not check.expect(match is not None, "attnserve --help", "option line",
                            "`  --name TYPE=default (Env:NAME)` and its description", repr(line)):
            continue
        flag = Flag(match["name"], match["type"], match["default"], match["env"])
        flags[flag.name] = flag
    check.expect(all(f in flags for f in ("grpc-address", "metrics-address", "http-address")),
                 "attnserve --help", "flags", "--grpc-address, --metrics-address and --http-address",
                 sorted(flags))
    return flags


def env_names(flags):
    """{ATTNSERVE_X: flag} from the (Env:...) annotations of --help."""
    return {f.env: f for f in flags.values() if f.env}


def value_problem(flag, value):
    """Why `value` is not one --flag accepts, or None. Covers CLI11's types shown by --help."""
    base, _, validator = flag.type.partition(":")
    if validator.startswith("{"):
        choices = validator[1:-1].split(",")
        return None if value in choices else f"one of {choices}"
    if base in ("INT", "FLOAT"):
        try:
            number = int(value) if base == "INT" else float(value)
        except ValueError:
            return f"{'an integer' if base == 'INT' else 'a number'} ({flag.type})"
        bounds = re.search(r"in \[(\S+) - (\S+)\]", validator)
        if validator == "POSITIVE" and not number > 0:
            return "a positive number"
        if validator == "NONNEGATIVE" and number < 0:
            return "a non-negative number"
        if bounds and not float(bounds[1]) <= number <= float(bounds[2]):
            return f"a number in [{bounds[1]}, {bounds[2]}]"
    if flag.name.endswith("-address") and value != "":
        return None if parse_port(value) is not None else "host:port"
    return None


def parse_port(address):
    host, sep, port = address.rpartition(":")
    return int(port) if sep and host and port.isdigit() and int(port) < 65536 else None


# ------------------------------------------------------------------------------------------------
# Effective flags of one place that runs attnserve: --help defaults < Dockerfile ENV < env < args.


def unknown_flag(name, flags):
    near = difflib.get_close_matches(name, flags, n=1)
    return f"unknown flag --{name}" + (f" (did you mean --{near[0]}?)" if near else "")


def apply_env(values, env, flags, file, field, check):
    names = env_names(flags)
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        flag = names.get(name)
        near = difflib.get_close_matches(name, names, n=1)
        if not check.expect(flag is not None, file, f"{field} {name}",
                            "a variable `attnserve --help` names (Env:...)",
                            "no such variable" + (f" (did you mean {near[0]}?)" if near else "")):
            continue
        if value is not None:
            set_value(values, flag, str(value), file, f"{field} {name}", check)


def apply_args(values, args, flags, file, field, check):
    index = 0
    while index < len(args):
        arg = str(args[index])
        index += 1
        if not check.expect(arg.startswith("--"), file, field, "`--long-flag[=value]` items",
                            repr(arg)):
            continue
        name, has_value, value = arg[2:].partition("=")
        flag = flags.get(name)
        if not check.expect(flag is not None, file, field, "flags of `attnserve --help`",
                            unknown_flag(name, flags)):
            continue
        if flag.takes_value() and not has_value:
            if not check.expect(index < len(args), file, field, f"a value after --{name}",
                                "the end of the list"):
                continue
            value, index = str(args[index]), index + 1
        set_value(values, flag, value, file, f"{field} --{name}", check)


def set_value(values, flag, value, file, field, check):
    problem = value_problem(flag, value)
    if check.expect(problem is None, file, field, problem, repr(value)):
        values[flag.name] = value


def effective(flags, layers, check):
    """Flag values after applying `layers`: (kind, mapping-or-list, file, field) in order.

    Also runs attnserve on the resulting environment and command line (see Flags.run_help)."""
    values = {name: f.default for name, f in flags.items() if f.default is not None}
    env, args = {}, []
    for kind, data, file, field in layers:
        if kind == "env":
            apply_env(values, data, flags, file, field, check)
            env.update({k: v for k, v in data.items() if k.startswith(ENV_PREFIX)})
        else:
            apply_args(values, data, flags, file, field, check)
            args = [str(a) for a in data]
    status, _, err = flags.run_help(args, env)
    files = [file for _, data, file, _ in layers if data] or ["Dockerfile"]
    check.expect(status == 0, files[-1], f"`attnserve {' '.join(args)} --help` with {sorted(env)}",
                 "exit 0 (attnserve accepts these flags and variables)",
                 f"exit {status}: {err.splitlines()[0] if err else ''}")
    return values


def number_flag(values, name):
    try:
        return whole(float(values.get(name)))
    except (TypeError, ValueError):
        return None


def ports_of(values, file, check):
    """(gRPC port, metrics port or None when metrics are off)."""
    grpc = parse_port(values.get("grpc-address", ""))
    check.expect(grpc not in (None, 0), file, "--grpc-address", "host:port with a fixed port",
                 values.get("grpc-address"))
    return grpc, optional_port(values, "metrics-address", file, check)


def http_port_of(values, file, check):
    """The REST port (--http-address), or None when REST is off."""
    return optional_port(values, "http-address", file, check)


def optional_port(values, flag, file, check):
    """The port of --FLAG, an address that "" turns off (None then); a fixed one, not 0."""
    address = values.get(flag, "")
    port = parse_port(address) if address else None
    check.expect(port != 0, file, f"--{flag}", "a fixed port (not 0)", address)
    return port
