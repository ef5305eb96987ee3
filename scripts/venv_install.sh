# Sourced by the install scripts: `venv_install [--no-compile] VENV PIP_ARGS...` installs into the
# virtualenv VENV.
#
# It uses uv (PyPI's `uv` wheel, fetched once into .uv/ by pip): on 2 cores uv resolves and installs
# Arena's .venv in about 80 s against pip's 200, and the side virtualenvs install beside lint and
# types instead of after them. uv reads none of pip's settings, so pip's own index, extra indexes,
# find-links (the local CPU torch wheel), constraint file, certificate and timeout are handed to it:
# both see the same packages and resolve the same versions. Byte-code is compiled at install, as pip
# does (PYTHONDONTWRITEBYTECODE would otherwise make every process compile what it imports), except
# with --no-compile: a side virtualenv whose few processes import a small part of what it installs
# (two more copies of torch) compiles only that part, with `compile_imports VENV MODULE...`.
# Where uv cannot be had, pip installs as before.

UV_DIR=.uv

_pip_setting() {  # PYTHON KEY: pip's value of KEY, its environment variable first, then its config files
  local var="PIP_$(printf '%s' "$2" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!var:-}" ]; then
    printf '%s\n' "${!var}"
  else
    "$1" -m pip config get "global.$2" 2>/dev/null || true
  fi
}

_uv_ready() {  # PYTHON: uv in $UV_DIR, fetched once by PYTHON's pip; concurrent installers share one lock
  (
    flock 9
    [ -x "$UV_DIR/bin/uv" ] && exit 0
    rm -rf "$UV_DIR.tmp"
    "$1" -m pip install -q --disable-pip-version-check --target "$UV_DIR.tmp" "uv>=0.5" >/dev/null 2>&1 \
      && rm -rf "$UV_DIR" && mv "$UV_DIR.tmp" "$UV_DIR"
  ) 9>"$UV_DIR.lock"
  [ -x "$UV_DIR/bin/uv" ]
}

venv_install() {
  local compile=1
  if [ "$1" = --no-compile ]; then
    compile=0
    shift
  fi
  local venv=$1
  local py=$venv/bin/python
  shift
  if [ "${ARENA_INSTALL_WITH:-uv}" = uv ] && _uv_ready "$py"; then
    local args=(--python "$py" --index-strategy unsafe-best-match)
    [ "$compile" = 1 ] && args+=(--compile-bytecode)
    local value
    for value in $(_pip_setting "$py" index-url); do args+=(--index-url "$value"); done
    for value in $(_pip_setting "$py" extra-index-url); do args+=(--extra-index-url "$value"); done
    for value in $(_pip_setting "$py" find-links); do args+=(--find-links "$value"); done
    for value in $(_pip_setting "$py" constraint); do [ -f "$value" ] && args+=(--constraint "$value"); done
    local env=()
    value=$(_pip_setting "$py" cert)
    [ -n "$value" ] && env+=("SSL_CERT_FILE=$value")
    value=$(_pip_setting "$py" default-timeout)
    [ -n "$value" ] && env+=("UV_HTTP_TIMEOUT=${UV_HTTP_TIMEOUT:-$value}")
    env "${env[@]}" "$UV_DIR/bin/uv" pip install -q "${args[@]}" "$@"
  elif [ "$compile" = 1 ]; then
    "$py" -m pip install -q "$@"
  else
    "$py" -m pip install -q --no-compile "$@"
  fi
}

compile_imports() {  # VENV MODULE...: import the modules once, writing byte-code for all they import
  local venv=$1
  shift
  local imports
  imports=$(printf 'import %s; ' "$@")
  PYTHONDONTWRITEBYTECODE= "$venv/bin/python" -c "$imports"
}
