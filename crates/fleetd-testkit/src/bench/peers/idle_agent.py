# An idle agent for `fleetd-bench peers`: shows a shell-like prompt ("> ") and waits; each line
# typed into its terminal is appended to the log given as its argument as "<unix µs> <line>",
# then it answers and shows the prompt again. The stand-in for a real agent at rest.
import sys
import time

log = open(sys.argv[1], "a", buffering=1)
sys.stdout.write("> ")
sys.stdout.flush()
for line in sys.stdin:
    log.write(f"{time.time_ns() // 1000} {line.strip()}\n")
    sys.stdout.write("ok\n> ")
    sys.stdout.flush()
