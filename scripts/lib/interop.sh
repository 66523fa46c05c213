# The interop tests' virtualenv (sourced by scripts/test-all, which makes it, and by .ci/run, which makes
# it early, beside clippy, so that the test command then finds it ready).
interop_venv() {
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r tests/interop/requirements.txt
}
