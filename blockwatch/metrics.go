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
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_events_total",
		Help: "Watch events received from etcd, by key prefix (blocks, hosts, pools) and type (put, delete).",
	}, []string{"source", "type"})
	relists := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_relists_total",
		Help: "Completed lists of the block, host and pool prefixes, by reason (initial, compacted, watch-error, requested, ...).",
	}, []string{"reason"})
	malformed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vpp_route_agent_malformed_values_total",
		Help: "Keys or values under the watched prefixes that could not be decoded and were skipped.",
	})
	for _, c := range []prometheus.Collector{events, relists, malformed} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register blockwatch metrics: %w", err)
		}
	}
	m := &metrics{relists: relists, malformed: malformed}
	for src := range numSources {
		m.events[src][mvccpb.PUT] = events.WithLabelValues(src.String(), "put")
		m.events[src][mvccpb.DELETE] = events.WithLabelValues(src.String(), "delete")
	}
	for _, r := range []string{ReasonInitial, ReasonCompacted, ReasonWatchError, ReasonWatchClosed, ReasonRequested, ReasonRestarted} {
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
