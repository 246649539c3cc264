# lib.sh - what the command-line test scripts share: counting checks and
# `expect`. Sourced by the scripts; each ends with
#   echo "NAME: $pass passed, $fail failed"; [ "$fail" = 0 ]
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# expect CODE PATTERN -- COMMAND...: COMMAND exits with CODE (within 10
# minutes) and prints PATTERN (an extended regular expression) on stdout
# or stderr.
expect() {
  local code=$1 pat=$2; shift 3
  local out rc
  out=$(timeout 600 "$@" 2>&1); rc=$?
  if [ "$rc" != "$code" ]; then bad "'$*' exited $rc, expected $code: $out"; return; fi
  if ! grep -qE -- "$pat" <<<"$out"; then bad "'$*' output lacks /$pat/: $out"; return; fi
  ok
}
