#!/usr/bin/env bash
# Reproduces the README's screenshot (docs/lab-prometheus-alerts.png): runs the lab (bin/vpplab; `make
# build` first) with its Prometheus, a 64-address IPv4 pool filled until block-ipam refuses a pod and
# every alert's `for` set to 0s; once BlockIPAMPoolUsageCritical fires, opens it (and the annotations) on
# Prometheus's alerts page and takes a 1280x900 screenshot with headless Chromium. Needs Debian's
# prometheus (make promtool) and chromium (apt-get install -y chromium). Usage: lab-screenshot.sh [OUT.png]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-docs/lab-prometheus-alerts.png}
bin=${BIN:-bin}
need() { command -v "$1" >/dev/null 2>&1 || { echo "lab-screenshot.sh: $1 not found; $2" >&2; exit 2; }; }
need chromium "Debian: apt-get install -y chromium"
need prometheus "Debian's package: make promtool"
[ -x "$bin/vpplab" ] || { echo "lab-screenshot.sh: $bin/vpplab not found; run make build" >&2; exit 2; }

work=$(mktemp -d /tmp/vpplab-screenshot.XXXXXX)
"$bin/vpplab" --ipv4-pool 10.244.0.0/26 --exhaust-pool --prometheus --alert-for 0s --keep-running \
  --data-dir "$work/lab" >"$work/lab.out" 2>&1 &
lab=$!
trap 'kill -TERM $lab 2>/dev/null; wait $lab 2>/dev/null; rm -rf "$work"' EXIT

# The lab's last step waits for the alert; its summary then lists it firing.
for _ in $(seq 240); do
  grep -q '^== The lab keeps running' "$work/lab.out" && break
  kill -0 $lab 2>/dev/null || { cat "$work/lab.out" >&2; echo "lab-screenshot.sh: the lab ended" >&2; exit 1; }
  sleep 0.5
done
grep -q '^firing   BlockIPAMPoolUsageCritical{family=ipv4,pool=lab-ipv4}' "$work/lab.out" ||
  { cat "$work/lab.out" >&2; echo "lab-screenshot.sh: BlockIPAMPoolUsageCritical does not fire" >&2; exit 1; }
ui=$(sed -n 's|^.*Prometheus web UI: \(http://[^ ]*\)/alerts .*$|\1|p' "$work/lab.out" | head -1)
sleep 3 # BlockIPAMClaimsRefused needs two samples of the counter after the refusal

# A page on Prometheus's own origin (--web.user-assets, served at /user/) that shows the alerts page
# and opens the critical alert and the annotations, as a user's two clicks would.
base=$(echo "$ui" | sed 's|^\(http://[^/]*\).*|\1|')
cat >"$work/lab/prometheus/user/screenshot.html" <<HTML
<!DOCTYPE html>
<html><head><style>html,body{margin:0;height:100%;overflow:hidden}iframe{border:0;width:100%;height:100%}</style></head>
<body><iframe id="page" src="${ui#"$base"}/alerts"></iframe>
<script>
document.getElementById('page').addEventListener('load', function () {
  var jq = this.contentWindow.jQuery;
  jq('.alert_header').filter(function () { return /BlockIPAMPoolUsageCritical/.test(jq(this).text()); }).click();
  jq('div.show-annotations').click();
});
</script></body></html>
HTML
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$work/chromium" --virtual-time-budget=3000 \
  --window-size=1280,900 --screenshot="$out" "$base/user/screenshot.html" >"$work/chromium.log" 2>&1 ||
  { cat "$work/chromium.log" >&2; exit 1; }
echo "lab-screenshot.sh: $out ($(stat -c %s "$out") bytes) from $ui/alerts"
