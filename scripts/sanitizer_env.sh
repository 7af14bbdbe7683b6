# Sourced: the sanitizer runtime options every sanitized test runs with (scripts/sanitize.sh).
# halt_on_error: the first report ends the process with an error, so the test fails.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:detect_leaks=1:abort_on_error=0:print_summary=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1:print_summary=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:print_summary=1}
