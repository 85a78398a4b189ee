# SPDX-License-Identifier: MIT
# crash_writer.py - the writer's side of lib.sh's crash handshake, for a
# python writer run in the background with PYTHONPATH="$IT_DIR": once it
# holds its files open it calls hold_until_go(T, fds), which touches T/ready,
# waits for T/go (crash_fs touches it once ulpackfs is dead) and then closes
# the files (their close fails on the dead mount: ignored).
import os
import time


def hold_until_go(t, held):
    open(os.path.join(t, "ready"), "w").close()
    while not os.path.exists(os.path.join(t, "go")):
        time.sleep(0.05)
    for fd in held:
        try:
            os.close(fd)
        except OSError:
            pass
