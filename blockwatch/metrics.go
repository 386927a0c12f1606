package blockwatch

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// metrics are the Watcher's Prometheus metrics. A nil *metrics (no Registerer) records nothing.
type metrics struct {
	events    [numSources][2]prometheus.Counter // by source, then mvccpb.PUT / mvccpb.DELETE
	relists   *prometheus.CounterVec
	malformed prometheus.Counter
	ownership *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_events_total",
		Help: "Watch events received from etcd, by key prefix (blocks, hosts, pools, affinities, ipam-config) and type (put, delete).",
	}, []string{"source", "type"})
	relists := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_relists_total",
		Help: "Completed lists of the block, host and pool prefixes, by reason (initial, compacted, watch-error, requested, ...).",
	}, []string{"reason"})
	malformed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vpp_route_agent_malformed_values_total",
		Help: "Keys or values under the watched prefixes that could not be decoded and were skipped.",
	})
	ownership := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vpp_route_agent_ownership_source",
		Help: "1 for the source block owners are read from (blocks or affinities: --ownership), 0 for the other.",
	}, []string{"source"})
	for _, c := range []prometheus.Collector{events, relists, malformed, ownership} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register blockwatch metrics: %w", err)
		}
	}
	m := &metrics{relists: relists, malformed: malformed, ownership: ownership}
	m.setOwnership(OwnershipBlocks)
	for src := range numSources {
		m.events[src][mvccpb.PUT] = events.WithLabelValues(src.String(), "put")
		m.events[src][mvccpb.DELETE] = events.WithLabelValues(src.String(), "delete")
	}
	for _, r := range RelistReasons() {
		relists.WithLabelValues(r)
	}
	return m, nil
}

func (m *metrics) event(src source, typ mvccpb.Event_EventType) {
	if m != nil && (typ == mvccpb.PUT || typ == mvccpb.DELETE) {
		m.events[src][typ].Inc()
	}
}

func (m *metrics) relist(reason string) {
	if m != nil {
		m.relists.WithLabelValues(reason).Inc()
	}
}

func (m *metrics) malformedValue() {
	if m != nil {
		m.malformed.Inc()
	}
}

// setOwnership records the source block owners are read from.
func (m *metrics) setOwnership(o Ownership) {
	if m == nil {
		return
	}
	for _, s := range []Ownership{OwnershipBlocks, OwnershipAffinities} {
		v := 0.0
		if s == o {
			v = 1
		}
		m.ownership.WithLabelValues(string(s)).Set(v)
	}
}
