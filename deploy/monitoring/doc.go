// Package monitoring holds the Prometheus alert rules (rules.yml, unit-tested by rules_test.yml),
// an example scrape configuration (prometheus.yml) and the Grafana dashboard (dashboard.json) of
// vpp-route-agent and block-ipamd. Its tests run promtool on them and check that every query names
// a metric the binaries export.
package monitoring
