"""Offline checks of the deployment files (run by deploy/scripts/check/deploy.sh, which installs the
pinned Python packages and the Compose schema first, and runs test_check_deploy.py).

Each check returns a list of problems (empty: passed); `check` prints one line per check."""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate import utils as kv_utils

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_DIR = ROOT / "deploy/compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
K8S_DIR = ROOT / "deploy/k8s"
PRESETS = ROOT / "topologies/presets"
# The oldest Kubernetes minor still widely run and the newest the package knows.
K8S_VERSIONS = ["1.30.0", kv_utils.latest_version()]
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|TOKEN|API_KEY)", re.I)

passed = 0
failed = 0


def check(name, fn, *args):
    global passed, failed
    try:
        problems = fn(*args) or []
    except Exception as error:  # a crash in a check is a failed check, with its reason
        problems = [f"{type(error).__name__}: {error}"]
    if problems:
        failed += 1
        print(f"FAIL {name}")
        for problem in problems:
            print(f"       {problem}")
    else:
        passed += 1
        print(f"ok   {name}")


def load_yaml_docs(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def rel(path):
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------- the config model (config.rs)

def rust_sources():
    yield from sorted((ROOT / "topologies/src").rglob("*.rs"))
    yield from sorted((ROOT / "operators/src").rglob("*.rs"))
    yield from sorted((ROOT / "operators/core/src").rglob("*.rs"))


def snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def config_model():
    """Structs (field -> type) and snake_case enums, as serde reads them."""
    structs, enums = {}, {}
    for path in rust_sources():
        text = path.read_text()
        for m in re.finditer(r"pub struct (\w+) \{\n(.*?)\n\}", text, re.S):
            fields = dict(re.findall(r"^    pub (\w+): (.+),\s*$", m.group(2), re.M))
            structs.setdefault(m.group(1), fields)
        for m in re.finditer(r"((?:#\[[^\n]*\]\n)+)pub enum (\w+) \{\n(.*?)\n\}", text, re.S):
            if 'rename_all = "snake_case"' in m.group(1):
                variants = re.findall(r"^    ([A-Z]\w*),?\s*$", m.group(3), re.M)
                enums.setdefault(m.group(2), [snake(v) for v in variants])
    if "Config" not in structs or "source" not in structs["Config"]:
        raise RuntimeError("topologies/src/config.rs: struct Config not found")
    return structs, enums


STRUCTS, ENUMS = config_model()


def base_type(rust_type):
    rust_type = rust_type.strip()
    m = re.fullmatch(r"Option<(.+)>", rust_type)
    if m:
        rust_type = m.group(1)
    return rust_type.split("::")[-1]


def check_value(path, rust_type, value, from_env=False):
    """Problems of one value against its Rust type (env values are strings, parsed like `config`)."""
    kind = base_type(rust_type)
    if kind in STRUCTS:
        if not isinstance(value, dict):
            return [f"{path}: expected a table"]
        return check_table(path, kind, value)
    if kind in ENUMS:
        if value not in ENUMS[kind]:
            return [f"{path} = {value!r}: expected one of {ENUMS[kind]}"]
        return []
    if kind in ("usize", "u64", "u32", "u16"):
        ok = (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
            from_env and isinstance(value, str) and value.isdigit())
        return [] if ok else [f"{path} = {value!r}: expected a non-negative integer"]
    if kind in ("f32", "f64"):
        try:
            float(value)
            return []
        except (TypeError, ValueError):
            return [f"{path} = {value!r}: expected a number"]
    if kind == "bool":
        ok = isinstance(value, bool) or (from_env and str(value).lower() in ("true", "false"))
        return [] if ok else [f"{path} = {value!r}: expected true or false"]
    if kind in ("String", "PathBuf"):
        return [] if isinstance(value, (str, int, float)) else [f"{path}: expected a string"]
    if kind.startswith("Vec<"):
        return [] if isinstance(value, list) or from_env else [f"{path}: expected a list"]
    return []


def check_table(path, struct, table):
    fields = STRUCTS[struct]
    problems = []
    for key, value in table.items():
        dotted = f"{path}.{key}" if path else key
        if key not in fields:
            problems.append(f"unknown key `{dotted}` ({struct} has: {', '.join(sorted(fields))})")
            continue
        problems += check_value(dotted, fields[key], value)
        if re.search(r"password|token|api_key|secret", key) and not key.endswith("_env"):
            problems.append(f"`{dotted}` holds a secret: secrets come from the environment")
        if key.endswith("_env") and not re.fullmatch(r"[A-Z_][A-Z0-9_]*", str(value)):
            problems.append(f"`{dotted}` = {value!r} is not an environment variable name")
    return problems


def check_config(table):
    problems = check_table("", "Config", table)
    if "source" not in table:
        problems.append("missing [source] (required)")
    return problems


def override_path(name):
    """RAGSTREAM_<SECTION>__<KEY> -> ["section", "key"]; None for other variables."""
    if not name.startswith("RAGSTREAM_") or "__" not in name:
        return None
    return name[len("RAGSTREAM_"):].lower().split("__")


def check_override(name, value):
    parts = override_path(name)
    struct, rust_type = "Config", None
    for depth, part in enumerate(parts):
        fields = STRUCTS.get(struct, {})
        if part not in fields:
            return [f"{name}: `{'.'.join(parts[:depth + 1])}` is not a config key"]
        rust_type = fields[part]
        struct = base_type(rust_type)
    if value is None:
        return []
    return check_value(".".join(parts), rust_type, value, from_env=True)


def apply_overrides(table, env):
    merged = json.loads(json.dumps(table))
    for name, value in env.items():
        parts = override_path(name)
        if parts and value is not None:
            node = merged
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
    return merged


def effective_problems(label, config, http_port, data_dir, workers_flag):
    """What a container needs of its configuration: reachable HTTP, index on the volume."""
    problems = []
    listen = str(config.get("http", {}).get("listen", "127.0.0.1:9464"))
    host, _, port = listen.rpartition(":")
    if host in ("127.0.0.1", "localhost", "[::1]"):
        problems.append(f"{label}: http.listen {listen} is loopback: unreachable from other containers")
    if port != str(http_port):
        problems.append(f"{label}: http.listen port {port} != the exposed port {http_port}")
    index = config.get("index", {})
    if index.get("kind", "edge") == "edge":
        path = str(index.get("path", ".ragstream/index"))
        if not (path.startswith(data_dir.rstrip("/") + "/")):
            problems.append(f"{label}: index.path {path} is not on the data volume {data_dir}")
    elif not index.get("url"):
        problems.append(f"{label}: index.kind = server needs index.url")
    if config.get("source", {}).get("kind") != "kafka":
        problems.append(f"{label}: source.kind is not kafka")
    workers = config.get("runtime", {}).get("workers", 1)
    if workers_flag is not None and str(workers_flag) != str(workers):
        problems.append(f"{label}: --workers {workers_flag} != runtime.workers {workers}: the index refuses a changed worker count")
    return problems


def run_flags():
    """Long and short flags of `ragstream run` (src/cli/mod.rs) plus the global ones."""
    text = (ROOT / "src/cli/mod.rs").read_text()
    flags = set()
    block = re.search(r"\n    Run \{\n(.*?)\n    \},", text, re.S)
    if not block:
        raise RuntimeError("src/cli/mod.rs: the Run subcommand was not found")
    cli = re.search(r"struct Cli \{\n(.*?)\n\}", text, re.S)
    for body in (block.group(1), cli.group(1) if cli else ""):
        for attrs, field in re.findall(r"((?:\s*#\[[^\n]*\]\n)+)\s*(\w+):", body):
            if "#[arg(" not in attrs:
                continue
            flags.add("--" + field.replace("_", "-"))
            short = re.search(r"\bshort\b(?:\s*=\s*'(\w)')?", attrs)
            if short:
                flags.add("-" + (short.group(1) or field[0]))
    return flags


RUN_FLAGS = run_flags()


def flag_problems(label, argv):
    problems = []
    if not argv or argv[0] != "run":
        return [f"{label}: the command is not `ragstream run …`: {argv}"]
    for arg in argv[1:]:
        if arg.startswith("-"):
            flag = arg.split("=", 1)[0]
            if flag not in RUN_FLAGS:
                problems.append(f"{label}: `ragstream run` has no {flag} (src/cli/mod.rs; it has {', '.join(sorted(RUN_FLAGS))})")
    return problems


def arg_value(argv, flag):
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


# ---------------------------------------------------------------- Dockerfile

def dockerfile_stages():
    lines, current = [], ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        lines.append(current + stripped)
        current = ""
    args, stages = {}, []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
            continue
        if instruction == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), words[0])
            alias = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append({"image": image, "alias": alias, "steps": []})
            continue
        if not stages:
            raise RuntimeError(f"Dockerfile: {instruction} before FROM")
        stages[-1]["steps"].append((instruction, rest))
    return stages


def dockerignore_patterns():
    path = ROOT / ".dockerignore"
    if not path.exists():
        return []
    return [l.strip().rstrip("/") for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")]


def ignored(path, patterns):
    from fnmatch import fnmatch
    parts = Path(path).parts
    return any(fnmatch(str(Path(*parts[: i + 1])), pattern.lstrip("/").removeprefix("**/"))
               or fnmatch(parts[i], pattern.removeprefix("**/"))
               for pattern in patterns for i in range(len(parts)))


def minimum_rust():
    """(version, who) pairs: the workspace's rust-version, and each locked crate's when its sources
    are in the local cargo registry (they are wherever the project was built)."""
    needs = []
    wanted = re.search(r'rust-version = "(\d+)\.(\d+)"', (ROOT / "Cargo.toml").read_text())
    if wanted:
        needs.append(((int(wanted.group(1)), int(wanted.group(2))), "the workspace's rust-version"))
    registry = Path(os.environ.get("CARGO_HOME") or Path.home() / ".cargo") / "registry/src"
    sources = list(registry.glob("*")) if registry.is_dir() else []
    for package in tomllib.loads((ROOT / "Cargo.lock").read_text()).get("package", []):
        if "source" not in package:
            continue
        for source in sources:
            manifest = source / f"{package['name']}-{package['version']}" / "Cargo.toml"
            if manifest.is_file():
                found = re.search(r'^rust-version = "(\d+)\.(\d+)', manifest.read_text(errors="replace"), re.M)
                if found:
                    needs.append(((int(found.group(1)), int(found.group(2))), f"{package['name']} {package['version']}"))
                break
    return needs


def check_dockerfile_structure():
    problems = []
    stages = dockerfile_stages()
    if len(stages) < 2:
        return ["expected a multi-stage build (build stage, then runtime)"]
    for stage in stages:
        image = stage["image"]
        if ":" not in image or image.endswith(":latest"):
            problems.append(f"FROM {image}: pin a tag")
    build = stages[0]
    m = re.fullmatch(r"rust:(\d+)(?:\.(\d+))?(?:\.\d+)?-(\w+)(?:-[\w.-]+)?", build["image"])
    if not m:
        problems.append(f"build stage image {build['image']} is not rust:<version>-<debian release>")
    else:
        if m.group(2) is not None:
            have = (int(m.group(1)), int(m.group(2)))
            for need, who in minimum_rust():
                if have < need:
                    problems.append(f"{build['image']} is older than Rust {need[0]}.{need[1]}, which {who} needs")
        runtime_release = stages[-1]["image"].split(":")[-1].split("-")[0]
        if m.group(3) != runtime_release:
            problems.append(f"build stage on {m.group(3)}, runtime on {runtime_release}: glibc must not be newer at build time")
    runs = " ".join(rest for stage in stages for instr, rest in stage["steps"] if instr == "RUN")
    if "cargo build --release --locked --bin ragstream --features" not in runs:
        problems.append("no `cargo build --release --locked --bin ragstream --features …`")
    final = stages[-1]
    if not final["image"].startswith("debian:bookworm-slim"):
        problems.append(f"runtime image {final['image']} is not debian:bookworm-slim")
    steps = final["steps"]
    users = [rest.split(":")[0].strip() for instr, rest in steps if instr == "USER"]
    if not users or users[-1] in ("root", "0"):
        problems.append("the runtime stage does not switch to a non-root USER")
    entry = [rest for instr, rest in steps if instr == "ENTRYPOINT"]
    if not entry or json.loads(entry[-1]) != ["/usr/local/bin/ragstream"]:
        problems.append("ENTRYPOINT is not [\"/usr/local/bin/ragstream\"] (exec form)")
    exposed = {p.split("/")[0] for instr, rest in steps if instr == "EXPOSE" for p in rest.split()}
    for port in ("9464", "2101"):
        if port not in exposed:
            problems.append(f"EXPOSE lacks {port}")
    envs = " ".join(rest for instr, rest in steps if instr == "ENV")
    model_dir = re.search(r"RAGSTREAM_MODEL_DIR=(\S+)", envs)
    if not model_dir:
        problems.append("runtime ENV lacks RAGSTREAM_MODEL_DIR (the embedder's model directory)")
    # The model: fetched by the project's script in some stage, copied to RAGSTREAM_MODEL_DIR.
    fetch = [(s, rest) for s in stages for instr, rest in s["steps"]
             if instr == "RUN" and "install/model.sh" in rest]
    if not fetch:
        problems.append("no stage runs deploy/scripts/install/model.sh (the model's only source)")
    else:
        stage, command = fetch[0]
        target = command.split("install/model.sh", 1)[1].split()
        copied = [rest for instr, rest in steps if instr == "COPY" and f"--from={stage['alias']}" in rest]
        if not target or not copied or not any(model_dir and rest.split()[-1].rstrip("/") == model_dir.group(1).rstrip("/")
                                               and rest.split()[-2].rstrip("/") == target[0].rstrip("/") for rest in copied):
            problems.append("the model fetched by install/model.sh is not copied to RAGSTREAM_MODEL_DIR")
        if not any(instr == "COPY" and "deploy/scripts/install/model.sh" in rest for instr, rest in stage["steps"]):
            problems.append("the model stage does not COPY deploy/scripts/install/model.sh")
    if not any(instr == "COPY" and rest.split()[-2].rstrip("/") == "topologies/presets"
               and rest.split()[-1].rstrip("/") == "/etc/ragstream" for instr, rest in steps):
        problems.append("the presets are not copied to /etc/ragstream/")
    workdir = [rest for instr, rest in steps if instr == "WORKDIR"]
    if workdir[-1:] != ["/var/lib/ragstream"]:
        problems.append("WORKDIR is not /var/lib/ragstream")
    # Graceful stop: the job's handler catches SIGINT; SIGTERM only with ctrlc's `termination` feature.
    stop = [rest for instr, rest in steps if instr == "STOPSIGNAL"]
    ctrlc_term = re.search(r'ctrlc\s*=\s*\{[^}]*"termination"', (ROOT / "Cargo.toml").read_text())
    if stop[-1:] != ["SIGINT"] and not ctrlc_term:
        problems.append("STOPSIGNAL is not SIGINT, and ctrlc lacks its `termination` feature: stops would be SIGKILLs")
    # Nothing piped from the network into a shell, no remote ADD.
    for stage in stages:
        for instr, rest in stage["steps"]:
            if instr == "RUN" and re.search(r"\b(curl|wget)\b[^|;&]*\|\s*(ba|z|da)?sh\b", rest):
                problems.append(f"pipe to shell: RUN {rest[:80]}")
            if instr == "ADD" and re.search(r"https?://", rest):
                problems.append(f"remote ADD: {rest[:80]}")
            if instr in ("ENV", "ARG") and re.search(r"(PASSWORD|SECRET|TOKEN|API_KEY)\w*=\S", rest, re.I):
                problems.append(f"a secret in {instr}: {rest.split('=')[0]}")
    # Every COPY source is in the build context and not excluded by .dockerignore.
    patterns = dockerignore_patterns()
    for wanted_pattern in ("target", ".git", ".ragstream", ".cache"):
        if wanted_pattern not in patterns:
            problems.append(f".dockerignore does not exclude {wanted_pattern}/")
    for stage in stages:
        for instr, rest in stage["steps"]:
            if instr != "COPY" or "--from=" in rest:
                continue
            for source in [w for w in rest.split() if not w.startswith("--")][:-1]:
                if not (ROOT / source).exists():
                    problems.append(f"COPY {source}: not in the repository")
                elif ignored(source.rstrip("/"), patterns):
                    problems.append(f"COPY {source}: excluded by .dockerignore")
    return problems


def dockerfile_user():
    steps = dockerfile_stages()[-1]["steps"]
    users = [rest.split(":")[0].strip() for instr, rest in steps if instr == "USER"]
    return users[-1] if users else None


# ---------------------------------------------------------------- compose

COMPOSE = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES = COMPOSE.get("services", {})


def check_compose_schema():
    schema = json.loads(Path(os.environ["CHECK_COMPOSE_SCHEMA"]).read_text())
    # The schema names draft-07 in a spelling jsonschema does not look up.
    if "draft-07" in schema.get("$schema", ""):
        validator = jsonschema.Draft7Validator(schema)
    else:
        validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(COMPOSE), key=lambda e: list(map(str, e.absolute_path)))]


def interpolate(value):
    """Compose interpolation with an empty shell: ${VAR:-default} -> default, ${VAR} -> ''."""
    if not isinstance(value, str):
        return value
    value = re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)
    return value.replace("$$", "$")


def environment(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict((item.split("=", 1) + [None])[:2] for item in env)
    return env


def volume_entries(service):
    for entry in service.get("volumes", []) or []:
        if isinstance(entry, str):
            parts = entry.split(":")
            source, target = (parts[0], parts[1]) if len(parts) > 1 else (None, parts[0])
            kind = "bind" if source and (source.startswith((".", "/", "~"))) else "volume"
            yield kind, source, target
        else:
            yield entry.get("type", "volume"), entry.get("source"), entry.get("target")


def check_compose_profiles():
    problems = []
    profiles = set()
    for name, service in SERVICES.items():
        own = service.get("profiles") or []
        profiles.update(own)
        if not own:
            problems.append(f"service {name} has no profile (it would start with every command)")
        if "all" not in own:
            problems.append(f"service {name} is not in the profile `all`")
        if name not in own:
            problems.append(f"service {name} is not in a profile of its own name")
    readme = (COMPOSE_DIR / "README.md").read_text()
    for named in sorted(set(re.findall(r"--profile[ =]([\w-]+)", readme))):
        if named not in profiles:
            problems.append(f"README.md names the profile `{named}`, which no service has")
    # Every `up` command in the README: the services it enables have their required dependencies enabled.
    commands = [line for line in readme.splitlines() if "docker compose" in line and " up" in line]
    if not commands:
        problems.append("README.md shows no `docker compose … up` command")
    for line in commands:
        active = set(re.findall(r"--profile[ =]([\w-]+)", line))
        enabled = {n for n, s in SERVICES.items() if active & set(s.get("profiles") or [])}
        if not enabled:
            problems.append(f"README command enables no service: {line.strip()}")
        for name in enabled:
            depends = SERVICES[name].get("depends_on") or {}
            if isinstance(depends, list):
                depends = {d: {} for d in depends}
            for dep, spec in depends.items():
                if dep not in SERVICES:
                    problems.append(f"{name} depends on unknown service {dep}")
                elif dep not in enabled and (spec or {}).get("required", True):
                    problems.append(f"`{line.strip()}`: {name} requires {dep}, whose profile is not active")
    return problems


def check_compose_mounts():
    problems = []
    declared = set((COMPOSE.get("volumes") or {}).keys())
    for name, service in SERVICES.items():
        for kind, source, target in volume_entries(service):
            if kind == "bind":
                if not (COMPOSE_DIR / source).exists():
                    problems.append(f"{name}: bind source {source} does not exist (relative to deploy/compose)")
            elif kind == "volume" and source and source not in declared:
                problems.append(f"{name}: volume {source} is not declared under volumes:")
        if "image" in service:
            image = service["image"]
            if "build" not in service and (":" not in image or image.endswith(":latest")):
                problems.append(f"{name}: image {image} has no pinned tag")
        build = service.get("build")
        if build:
            context = COMPOSE_DIR / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            if not (context / dockerfile).is_file():
                problems.append(f"{name}: build {rel(context / dockerfile)} does not exist")
        for key, value in environment(service).items():
            if SECRET_NAME.search(key) and value is not None:
                text = str(value)
                if not re.fullmatch(r"\$\{\w+(:?-)?\}", text):
                    problems.append(f"{name}: {key} has a value in the file; pass it through from the shell (`{key}:`)")
        for port in service.get("ports", []) or []:
            if isinstance(port, str) and port.count(":") == 1:
                problems.append(f"{name}: port {port} is published on every interface; bind 127.0.0.1")
    return problems


def check_compose_ragstream():
    problems = []
    service = SERVICES.get("ragstream")
    if not service:
        return ["no ragstream service"]
    command = service.get("command")
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command or []]
    problems += flag_problems("command", argv)
    config_path = arg_value(argv, "--config") or arg_value(argv, "-c")
    if not config_path or not config_path.startswith("/etc/ragstream/"):
        return problems + [f"command config {config_path} is not under /etc/ragstream (the image's presets)"]
    preset = PRESETS / config_path.removeprefix("/etc/ragstream/")
    if not preset.is_file():
        return problems + [f"{config_path}: no preset {rel(preset)}"]
    env = environment(service)
    for key, value in env.items():
        if override_path(key):
            problems += check_override(key, interpolate(value))
    config = apply_overrides(tomllib.loads(preset.read_text()), {k: interpolate(v) for k, v in env.items()})
    if interpolate(env.get("RAGSTREAM_INDEX__KIND")) == "server" or env.get("RAGSTREAM_INDEX__URL"):
        url = str(interpolate(env.get("RAGSTREAM_INDEX__URL") or ""))
        host = re.sub(r"^\w+://", "", url).split(":")[0]
        if host and host not in SERVICES:
            problems.append(f"RAGSTREAM_INDEX__URL {url}: no compose service {host}")
    brokers = str(config.get("kafka", {}).get("brokers", ""))
    for broker in brokers.split(","):
        if broker.split(":")[0] not in SERVICES:
            problems.append(f"kafka.brokers {broker}: no compose service of that name")
    data = [target for kind, source, target in volume_entries(service) if kind == "volume"]
    if "/var/lib/ragstream" not in data:
        problems.append("no named volume at /var/lib/ragstream (the index would die with the container)")
    published = {str(p).rsplit(":", 1)[-1] for p in service.get("ports", []) or []}
    port = str(config.get("http", {}).get("listen", "")).rpartition(":")[2]
    if port not in published:
        problems.append(f"the HTTP port {port} is not published")
    problems += effective_problems("effective config", config, port, "/var/lib/ragstream", arg_value(argv, "--workers"))
    test = (service.get("healthcheck") or {}).get("test") or []
    if "/healthz" not in " ".join(map(str, test)):
        problems.append("the healthcheck does not probe /healthz")
    return problems


def feature_closure(names, table):
    """The features `names` turn on (Cargo.toml's [features]), themselves included."""
    seen, todo = set(), [n.strip() for n in names if n.strip()]
    while todo:
        name = todo.pop()
        if name in seen or name.startswith("dep:") or "/" in name:
            continue
        if name not in table:
            raise KeyError(name)
        seen.add(name)
        todo += table[name]
    return seen


def needed_features(config):
    """The components a config needs (the job refuses it at load without them)."""
    needs = set()
    if config.get("source", {}).get("kind") == "kafka":
        needs.add("kafka")
    if config.get("index", {}).get("kind") == "server":
        needs.add("qdrant-server")
    return needs


def check_image_features():
    problems = []
    table = tomllib.loads((ROOT / "Cargo.toml").read_text()).get("features", {})
    build = dockerfile_stages()[0]
    args = {rest.partition("=")[0].strip(): rest.partition("=")[2].strip()
            for instr, rest in build["steps"] if instr == "ARG"}
    default = args.get("RAGSTREAM_FEATURES")
    runs = " ".join(rest for instr, rest in build["steps"] if instr == "RUN")
    if not default:
        return ["the build stage has no `ARG RAGSTREAM_FEATURES=<features>`"]
    if '--features "${RAGSTREAM_FEATURES}"' not in runs:
        problems.append('the build stage does not build `--features "${RAGSTREAM_FEATURES}"`')
    service = SERVICES.get("ragstream") or {}
    build_args = (service.get("build") or {}).get("args") or {}
    if build_args.get("RAGSTREAM_FEATURES") != default:
        problems.append(f"compose builds ragstream with RAGSTREAM_FEATURES={build_args.get('RAGSTREAM_FEATURES')!r}, "
                        f"the Dockerfile's default is {default!r}")
    try:
        built = feature_closure(default.split(","), table)
    except KeyError as unknown:
        return problems + [f"RAGSTREAM_FEATURES names {unknown}, not a feature of Cargo.toml"]
    configs = {f"preset {rel(p)}": tomllib.loads(p.read_text()) for p in sorted(PRESETS.glob("*.toml"))}
    command = service.get("command")
    argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command or []]
    config_path = arg_value(argv, "--config") or ""
    preset = PRESETS / config_path.removeprefix("/etc/ragstream/")
    if preset.is_file():
        env = {k: interpolate(v) for k, v in environment(service).items()}
        configs["compose's effective config"] = apply_overrides(tomllib.loads(preset.read_text()), env)
    for config_map in k8s_objects("ConfigMap"):
        for key, text in (config_map.get("data") or {}).items():
            if key.endswith(".toml"):
                configs[f"ConfigMap {config_map['metadata']['name']} {key}"] = tomllib.loads(text)
    for label, config in configs.items():
        missing = needed_features(config) - built
        if missing:
            problems.append(f"{label} needs the features {sorted(missing)}; the image builds {default!r}")
    return problems


def check_prometheus_wiring():
    problems = []
    service = SERVICES.get("prometheus")
    if not service:
        return ["no prometheus service"]
    config_target = "/etc/prometheus/prometheus.yml"
    for arg in service.get("command") or []:
        if str(arg).startswith("--config.file="):
            config_target = str(arg).split("=", 1)[1]
    mounts = {target: COMPOSE_DIR / source for kind, source, target in volume_entries(service) if kind == "bind"}
    if config_target not in mounts:
        return [f"nothing is mounted at {config_target}"]
    config = yaml.safe_load(mounts[config_target].read_text())
    upstream = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    jobs = [job["job_name"] for job in config.get("scrape_configs", [])]
    upstream_jobs = [job["job_name"] for job in upstream.get("scrape_configs", [])]
    if jobs != upstream_jobs:
        problems.append(f"scrape jobs {jobs} != deploy/prometheus/prometheus.yml's {upstream_jobs} (the alerts select on them)")
    alerts_text = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    for job in set(re.findall(r'job="([^"]+)"', alerts_text)) - set(jobs):
        problems.append(f"alerts.yml selects job=\"{job}\", which this config does not scrape")
    targets = [t for job in config.get("scrape_configs", []) for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
    rag = SERVICES.get("ragstream", {})
    preset_port = "9464"
    listen = environment(rag).get("RAGSTREAM_HTTP__LISTEN")
    if listen:
        preset_port = str(interpolate(listen)).rpartition(":")[2]
    if f"ragstream:{preset_port}" not in targets:
        problems.append(f"targets {targets} do not include ragstream:{preset_port}")
    config_dir = Path(config_target).parent
    for rule in config.get("rule_files", []):
        target = str(config_dir / rule)
        if target not in mounts:
            problems.append(f"rule file {rule}: nothing mounted at {target}")
    promtool = os.environ.get("CHECK_PROMTOOL")
    if not promtool:
        log = Path(os.environ["CHECK_PROMTOOL_LOG"])
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        return problems + ["promtool unavailable (deploy/scripts/install/prometheus.sh failed): " + " | ".join(tail)]
    # The container's view: every bind mount placed at its target under a scratch root.
    with tempfile.TemporaryDirectory() as scratch:
        for target, source in mounts.items():
            staged = Path(scratch + target)
            staged.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                staged.symlink_to(source.resolve(), target_is_directory=True)
            else:
                staged.write_bytes(source.read_bytes())
        result = subprocess.run([promtool, "check", "config", scratch + config_target],
                                capture_output=True, text=True)
        if result.returncode != 0:
            problems.append("promtool check config: " + (result.stdout + result.stderr).strip().replace("\n", " | "))
    return problems


def check_grafana_wiring():
    problems = []
    service = SERVICES.get("grafana")
    if not service:
        return ["no grafana service"]
    mounts = {target: COMPOSE_DIR / source for kind, source, target in volume_entries(service) if kind == "bind"}
    provisioning = mounts.get("/etc/grafana/provisioning")
    if not provisioning:
        return ["deploy/grafana/provisioning is not mounted at /etc/grafana/provisioning"]
    providers = [p for f in sorted((provisioning / "dashboards").glob("*.y*ml"))
                 for p in (yaml.safe_load(f.read_text()) or {}).get("providers", [])]
    if not providers:
        problems.append("no dashboard provider in the mounted provisioning")
    for provider in providers:
        path = (provider.get("options") or {}).get("path")
        source = mounts.get(path)
        if not source:
            problems.append(f"provider {provider.get('name')}: nothing mounted at {path}")
            continue
        dashboards = sorted(source.glob("*.json"))
        if not dashboards:
            problems.append(f"provider {provider.get('name')}: {rel(source)} has no dashboards")
        for dashboard in dashboards:
            try:
                json.loads(dashboard.read_text())
            except ValueError as error:
                problems.append(f"{rel(dashboard)}: {error}")
    datasources = [d for f in sorted((provisioning / "datasources").glob("*.y*ml"))
                   for d in (yaml.safe_load(f.read_text()) or {}).get("datasources", [])]
    for datasource in datasources:
        url = datasource.get("url", "")
        m = re.fullmatch(r"https?://([\w.-]+):(\d+)/?", url)
        if not m or m.group(1) not in SERVICES:
            problems.append(f"datasource {datasource.get('name')} url {url} is not a compose service")
        elif m.group(1) == "prometheus" and m.group(2) != "9090":
            problems.append(f"datasource url {url}: Prometheus listens on 9090")
    if not datasources:
        problems.append("no datasource in the mounted provisioning")
    return problems


# ---------------------------------------------------------------- Kubernetes

def k8s_documents():
    docs = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs[path.name] = load_yaml_docs(path)
    return docs


K8S = k8s_documents()


def k8s_objects(kind=None):
    return [d for docs in K8S.values() for d in docs if kind is None or d.get("kind") == kind]


def one(kind):
    objects = k8s_objects(kind)
    if len(objects) != 1:
        raise RuntimeError(f"expected one {kind} in deploy/k8s, found {len(objects)}")
    return objects[0]


def check_k8s_schemas():
    problems = []
    for name, docs in K8S.items():
        for doc in docs:
            if doc.get("apiVersion", "").startswith("monitoring.coreos.com/"):
                continue  # a CRD: checked by its own schema below
            for version in K8S_VERSIONS:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kv_utils.ValidationError as error:
                    where = ".".join(map(str, error.path))
                    problems.append(f"{name} {doc.get('kind')}/{doc['metadata'].get('name')} (k8s {version}): {where}: {error.message}")
                except kv_utils.SchemaNotFoundError as error:
                    problems.append(f"{name}: {error.message}")
    return problems


SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "minProperties": 1,
                             "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                                            "matchExpressions": {"type": "array"}},
                             "additionalProperties": False},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object",
                    "anyOf": [{"required": ["port"]}, {"required": ["targetPort"]}],
                    "properties": {
                        "port": {"type": "string"}, "targetPort": {}, "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                        "interval": {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"},
                        "scrapeTimeout": {"type": "string"}, "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array"}, "metricRelabelings": {"type": "array"},
                        "params": {"type": "object"}, "tlsConfig": {"type": "object"},
                        "authorization": {"type": "object"}, "bearerTokenSecret": {"type": "object"},
                        "basicAuth": {"type": "object"}, "honorTimestamps": {"type": "boolean"},
                        "followRedirects": {"type": "boolean"}, "enableHttp2": {"type": "boolean"},
                        "filterRunning": {"type": "boolean"}, "proxyUrl": {"type": "string"},
                    },
                    "additionalProperties": False}},
                "jobLabel": {"type": "string"},
                "namespaceSelector": {"type": "object"},
                "targetLabels": {"type": "array"}, "podTargetLabels": {"type": "array"},
                "sampleLimit": {"type": "integer"}, "targetLimit": {"type": "integer"},
                "labelLimit": {"type": "integer"}, "attachMetadata": {"type": "object"},
                "scrapeClass": {"type": "string"}, "scrapeProtocols": {"type": "array"},
            },
        },
    },
}


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def check_service_monitor():
    monitors = k8s_objects("ServiceMonitor")
    if not monitors:
        return ["no ServiceMonitor"]
    problems = []
    for monitor in monitors:
        problems += [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                     for e in jsonschema.Draft7Validator(SERVICE_MONITOR_SCHEMA).iter_errors(monitor)]
        if problems:
            continue
        spec = monitor["spec"]
        services = [s for s in k8s_objects("Service")
                    if labels_match(spec["selector"].get("matchLabels"), s["metadata"].get("labels", {}))]
        if len(services) != 1:
            problems.append(f"the selector matches {len(services)} services (want exactly one: no double scraping)")
            continue
        service = services[0]
        port_names = {p.get("name") for p in service["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            if endpoint.get("port") and endpoint["port"] not in port_names:
                problems.append(f"endpoint port {endpoint['port']} is not a port of service {service['metadata']['name']}")
        upstream = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
        job = upstream["scrape_configs"][0]["job_name"]
        label = spec.get("jobLabel")
        value = service["metadata"].get("labels", {}).get(label) if label else service["metadata"]["name"]
        if value != job:
            problems.append(f"the scraped job would be {value!r}, the alert rules select job={job!r}")
    return problems


def check_kustomization():
    path = K8S_DIR / "kustomization.yaml"
    text = path.read_text()
    kustomization = yaml.safe_load(text)
    problems = []
    listed = kustomization.get("resources", [])
    for resource in listed:
        if not (K8S_DIR / resource).is_file():
            problems.append(f"resource {resource} does not exist")
    optional = set(re.findall(r"^\s*#\s*-\s*(\S+\.yaml)\s*$", text, re.M))
    for name in K8S:
        if name not in listed and name not in optional:
            problems.append(f"{name} is neither a resource nor an optional (commented) one")
    return problems


def pod_spec():
    return one("StatefulSet")["spec"]["template"]["spec"]


def container():
    containers = pod_spec()["containers"]
    if len(containers) != 1:
        raise RuntimeError("expected one container in the StatefulSet")
    return containers[0]


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def check_statefulset_wiring():
    problems = []
    sts = one("StatefulSet")
    spec = sts["spec"]
    template_labels = spec["template"]["metadata"].get("labels", {})
    c = container()
    env = env_of(c)
    services = {s["metadata"]["name"]: s for s in k8s_objects("Service")}
    headless = services.get(spec.get("serviceName"))
    if not headless:
        problems.append(f"serviceName {spec.get('serviceName')} is not a Service in deploy/k8s")
    else:
        if headless["spec"].get("clusterIP") != "None":
            problems.append(f"{headless['metadata']['name']} is not headless (clusterIP: None)")
        if headless["spec"].get("publishNotReadyAddresses") is not True:
            problems.append(f"{headless['metadata']['name']} lacks publishNotReadyAddresses: true (peers must resolve before ready)")
    if spec.get("podManagementPolicy") != "Parallel":
        problems.append("podManagementPolicy is not Parallel (the pods wait for each other)")
    if not labels_match(spec["selector"].get("matchLabels"), template_labels):
        problems.append("the StatefulSet's selector does not match its pod labels")
    container_ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for name, service in services.items():
        if not labels_match(service["spec"].get("selector"), template_labels):
            problems.append(f"service {name} does not select the pods")
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            if target not in container_ports and target not in container_ports.values():
                problems.append(f"service {name} port {port.get('name')} targets {target}, not a container port")
    if headless and {"timely", "http"} - {p.get("name") for p in headless["spec"]["ports"]}:
        problems.append("the headless service lacks the timely or http port")
    processes = env.get("RAGSTREAM_PROCESSES", {}).get("value")
    if str(processes) != str(spec.get("replicas")):
        problems.append(f"RAGSTREAM_PROCESSES={processes} != spec.replicas={spec.get('replicas')}")
    instance = env.get("RAGSTREAM_KAFKA__INSTANCE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if instance != "metadata.name":
        problems.append("RAGSTREAM_KAFKA__INSTANCE_ID does not come from the pod name (static membership)")
    namespace = env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    if namespace != "metadata.namespace":
        problems.append("POD_NAMESPACE does not come from the downward API")
    for name, entry in env.items():
        if override_path(name) and "value" in entry:
            problems += check_override(name, entry["value"])
        if SECRET_NAME.search(name) and not name.endswith("_ENV"):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if not ref:
                problems.append(f"{name} is not read from a Secret (secretKeyRef)")
            elif name == "RAGSTREAM_QUERY_TOKEN":
                # The pods listen beyond loopback: the job refuses to start without a token.
                if ref.get("optional") is True:
                    problems.append(f"{name}: secretKeyRef is optional (the job listens beyond loopback and needs a token)")
            elif ref.get("optional") is not True:
                problems.append(f"{name}: secretKeyRef is not optional (pods would not start without the Secret)")
    # Probes on the named HTTP port: /healthz for liveness, /readyz for readiness.
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path:
            problems.append(f"{probe} does not GET {path}")
        if get.get("port") not in container_ports and get.get("port") not in container_ports.values():
            problems.append(f"{probe} port {get.get('port')} is not a container port")
    annotations = spec["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/path") != "/metrics" \
            or annotations.get("prometheus.io/port") != str(container_ports.get("http")):
        problems.append("prometheus.io/scrape|port|path annotations do not point at the http port's /metrics")
    # The pod meets the restricted Pod Security Standard the namespace enforces, as the image's user.
    pod_security = pod_spec().get("securityContext", {})
    container_security = c.get("securityContext", {})
    if pod_security.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot is not true")
    if str(pod_security.get("runAsUser")) != str(dockerfile_user()):
        problems.append(f"runAsUser {pod_security.get('runAsUser')} != the image's USER {dockerfile_user()}")
    if (pod_security.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile is not RuntimeDefault")
    if container_security.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation is not false")
    if "ALL" not in ((container_security.get("capabilities") or {}).get("drop") or []):
        problems.append("capabilities are not dropped (drop: [ALL])")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    if container_security.get("readOnlyRootFilesystem") is True and "/tmp" not in mounts:
        problems.append("readOnlyRootFilesystem without a volume at /tmp (the hostfile)")
    claims = {t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])}
    data = mounts.get("/var/lib/ragstream")
    if not data or data["name"] not in claims:
        problems.append("/var/lib/ragstream is not a volumeClaimTemplate (each process's own index disk)")
    resources = c.get("resources", {})
    for key in ("cpu", "memory"):
        if key not in resources.get("requests", {}) or key not in resources.get("limits", {}):
            problems.append(f"resources lack a {key} request or limit")
    return problems


def entrypoint_argv():
    """The StatefulSet's shell script and the `ragstream …` arguments after its exec."""
    c = container()
    if c.get("command") != ["/bin/sh", "-c"]:
        raise RuntimeError("the container's command is not [/bin/sh, -c]")
    script = c["args"][0]
    line = re.search(r"exec ragstream (.*?)(?:\n(?!\s)|\Z)", script.replace("\\\n", " "), re.S)
    if not line:
        raise RuntimeError("the entrypoint script does not `exec ragstream …`")
    return script, shlex.split(line.group(1).strip())


def kubernetes_expand(text, env):
    """Kubernetes' $(NAME) expansion in command/args: $$ escapes, unknown references stay as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2:end]
                    out.append(env[name] if name in env else text[i:end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def check_configmap_config():
    problems = []
    c = container()
    _, argv = entrypoint_argv()
    problems += flag_problems("entrypoint", argv)
    config_path = arg_value(argv, "--config") or ""
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod_spec().get("volumes", [])}
    mount = mounts.get(str(Path(config_path).parent))
    if not mount or "configMap" not in volumes.get(mount["name"], {}):
        return problems + [f"--config {config_path}: its directory is not a mounted ConfigMap"]
    name = volumes[mount["name"]]["configMap"]["name"]
    maps = [m for m in k8s_objects("ConfigMap") if m["metadata"]["name"] == name]
    key = Path(config_path).name
    if not maps or key not in maps[0].get("data", {}):
        return problems + [f"ConfigMap {name} has no key {key}"]
    config = tomllib.loads(maps[0]["data"][key])
    sections = set(STRUCTS["Config"])
    preset_sections = set(tomllib.loads((PRESETS / "kafka.toml").read_text()))
    for section in config:
        if section not in sections:
            problems.append(f"[{section}] is not a config section (config.rs: {', '.join(sorted(sections))}; kafka.toml: {', '.join(sorted(preset_sections))})")
    problems += check_config(config)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    effective = apply_overrides(config, env)
    http_port = {p["name"]: p["containerPort"] for p in c.get("ports", [])}.get("http")
    problems += effective_problems("ConfigMap", effective, http_port, "/var/lib/ragstream", arg_value(argv, "--workers"))
    # It is the preset with this cluster's brokers: nothing else may drift.
    preset = tomllib.loads((PRESETS / "cluster.toml").read_text())
    for table in (preset, config):
        table.get("kafka", {}).pop("brokers", None)
    if preset != config:
        problems.append("ConfigMap cluster.toml differs from topologies/presets/cluster.toml beyond kafka.brokers")
    return problems


def check_entrypoint_run():
    """Runs the entrypoint script with a stand-in `ragstream` for every pod ordinal."""
    sts = one("StatefulSet")
    spec = sts["spec"]
    c = container()
    script, _ = entrypoint_argv()
    declared = {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
    replicas = int(spec["replicas"])
    timely_port = {p["name"]: p["containerPort"] for p in c.get("ports", [])}["timely"]
    problems = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        (scratch / "bin").mkdir()
        stub = scratch / "bin/ragstream"
        stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$ARGS_OUT"\n')
        stub.chmod(0o755)
        # The peers' names resolve only inside the cluster.
        resolver = scratch / "bin/getent"
        resolver.write_text('#!/bin/sh\nexit 0\n')
        resolver.chmod(0o755)
        hostfile = scratch / "hostfile"
        body = kubernetes_expand(script, declared).replace("/tmp/hostfile", str(hostfile))
        expected_hosts = [f"{sts['metadata']['name']}-{i}.{spec['serviceName']}.ns-check.svc.cluster.local:{timely_port}"
                          for i in range(replicas)]
        for ordinal in range(replicas + 1):
            env = {"PATH": f"{scratch / 'bin'}:/usr/bin:/bin", "HOSTNAME": f"{sts['metadata']['name']}-{ordinal}",
                   "POD_NAMESPACE": "ns-check", "ARGS_OUT": str(scratch / "args"), **declared}
            result = subprocess.run(["/bin/sh", "-c", body], env=env, capture_output=True, text=True, timeout=30)
            if ordinal == replicas:
                if result.returncode == 0:
                    problems.append(f"ordinal {ordinal} (outside {replicas} processes) started instead of failing")
                continue
            if result.returncode != 0:
                problems.append(f"ordinal {ordinal}: exit {result.returncode}: {result.stderr.strip()}")
                continue
            hosts = hostfile.read_text().splitlines()
            if hosts != expected_hosts:
                problems.append(f"ordinal {ordinal}: hostfile {hosts} != {expected_hosts}")
            args = (scratch / "args").read_text().splitlines()
            want = {"--processes": str(replicas), "--process": str(ordinal), "--hostfile": str(hostfile),
                    "--config": "/etc/ragstream/cluster.toml"}
            for flag, value in want.items():
                if arg_value(args, flag) != value:
                    problems.append(f"ordinal {ordinal}: {flag} is {arg_value(args, flag)!r}, want {value!r}")
    return problems


def check_k8s_secrets_doc():
    readme = (K8S_DIR / "README.md").read_text()
    problems = []
    refs = [e["valueFrom"]["secretKeyRef"] for e in container().get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})]
    if not refs:
        return ["no secretKeyRef in the StatefulSet"]
    for ref in refs:
        if ref["name"] not in readme or ref["key"] not in readme:
            problems.append(f"README.md does not document Secret {ref['name']} key {ref['key']}")
    if k8s_objects("Secret"):
        problems.append("a Secret manifest is committed: secrets are created by hand (README.md)")
    return problems


# ---------------------------------------------------------------- presets

def check_presets():
    problems = []
    for preset in sorted(PRESETS.glob("*.toml")):
        problems += [f"{preset.name}: {p}" for p in check_config(tomllib.loads(preset.read_text()))]
    return problems


def check_cluster_preset():
    config = tomllib.loads((PRESETS / "cluster.toml").read_text())
    problems = effective_problems("cluster.toml", config, 9464, "/var/lib/ragstream", None)
    if config.get("kafka", {}).get("instance_id"):
        problems.append("cluster.toml sets kafka.instance_id: it must differ per instance (set it from the environment)")
    return problems


def main():
    check("presets: every topologies/presets/*.toml uses only keys and values of config.rs", check_presets)
    check("presets: cluster.toml listens on all interfaces, index on /var/lib/ragstream, Kafka", check_cluster_preset)
    check("dockerfile: stages, non-root user, model from install/model.sh, presets, ports, no pipe-to-shell", check_dockerfile_structure)
    check(f"compose: valid against the Compose Specification schema ({os.environ['CHECK_COMPOSE_SCHEMA_SOURCE']})", check_compose_schema)
    check("compose: every service in its own profile and `all`; README profiles and commands resolve", check_compose_profiles)
    check("compose: bind mounts and build context exist, volumes declared, images pinned, no secrets", check_compose_mounts)
    check("compose: ragstream command, preset, env overrides (config.rs keys), volume, port, healthcheck", check_compose_ragstream)
    check("image: the features it builds (Dockerfile, compose) cover what every preset, compose and the ConfigMap need", check_image_features)
    check("compose: prometheus scrapes ragstream:9464 as job `ragstream`, rules mounted, promtool check config", check_prometheus_wiring)
    check("compose: grafana provisioning and dashboards mounted where the provider reads, datasource prometheus:9090", check_grafana_wiring)
    check(f"k8s: manifests valid against the Kubernetes {' and '.join(K8S_VERSIONS)} schemas, strict "
          f"(kubernetes-validate {kubernetes_validate.__version__})", check_k8s_schemas)
    check("k8s: ServiceMonitor shape (CRD schema subset), selects one service, port and job label match", check_service_monitor)
    check("k8s: kustomization lists every manifest", check_kustomization)
    check("k8s: StatefulSet, services, probes, env, security context, volumes agree", check_statefulset_wiring)
    check("k8s: ConfigMap cluster.toml parses, config.rs keys, matches the preset, flags exist in src/cli/mod.rs", check_configmap_config)
    check("k8s: entrypoint script writes the hostfile and runs ragstream with the pod's process index", check_entrypoint_run)
    check("k8s: secrets only through secretKeyRef to a documented, uncommitted Secret", check_k8s_secrets_doc)
    print(f"deploy checks: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
