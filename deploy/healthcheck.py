"""Container health check for `toolproxy serve` (the image's HEALTHCHECK, Kubernetes' probes).

    python /opt/toolproxy/healthcheck.py          exit 0 while recording works (health 200)
    python /opt/toolproxy/healthcheck.py --alive  exit 0 while the proxy answers at all (200 or 503)

A command rather than an HTTP probe because a proxy with --auth-token answers its admin routes
only to callers that present the token, and a probe's headers would have to hold the token in the
manifest; this reads it from the container's own environment (TOOLPROXY_AUTH_TOKEN).
TOOLPROXY_HEALTH_URL overrides the address (default http://127.0.0.1:8787/_toolproxy/health).
"""

import os
import sys
import urllib.error
import urllib.request

URL = os.environ.get("TOOLPROXY_HEALTH_URL", "http://127.0.0.1:8787/_toolproxy/health")


def main(argv: list[str]) -> int:
    alive_only = argv == ["--alive"]
    if argv and not alive_only:
        print("usage: healthcheck.py [--alive]", file=sys.stderr)
        return 2
    token = os.environ.get("TOOLPROXY_AUTH_TOKEN")
    request = urllib.request.Request(URL, headers={"X-Toolproxy-Token": token} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=4) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"toolproxy does not answer at {URL}: {exc}", file=sys.stderr)
        return 1
    if status == 200 or (alive_only and status == 503):
        return 0
    print(f"toolproxy health at {URL}: HTTP {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
