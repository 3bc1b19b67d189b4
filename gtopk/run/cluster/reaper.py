"""``python -m gtopk.run.cluster.reaper NAME...``: wait until stdin reaches EOF (the owning
job closed the pipe or died, SIGKILL included), then delete the named namespaces and
everything still running in them. Ignores SIGINT/SIGTERM so a Ctrl-C of the job's
process group cannot stop the cleanup."""

import signal
import sys

from gtopk.run.cluster import netns

if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()
    netns.delete(sys.argv[1:])
