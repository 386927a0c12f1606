package blockwatch

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// metrics are the Watcher's Prometheus metrics. A nil *metrics (no Registerer) records nothing.
type metrics struct {
	events    [numSources][2]prometheus.Counter // by source, then mvccpb.PUT / mvccpb.DELETE
	relists   *prometheus.CounterVec
	malformed [numSources]prometheus.Counter
	problems  *prometheus.CounterVec
	ownership *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_events_total",
		Help: "Watch events received from etcd, by key prefix (blocks, hosts, pools, affinities, ipam-config, nodes, felixconfigurations) and type (put, delete).",
	}, []string{"source", "type"})
	relists := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_etcd_relists_total",
		Help: "Completed lists of the watched prefixes, by reason (initial, compacted, watch-error, requested, ...).",
	}, []string{"reason"})
	malformed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_malformed_values_total",
		Help: "Keys or values under the watched prefixes that could not be decoded and were skipped, by source (as in etcd_events_total).",
	}, []string{"source"})
	problems := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vpp_route_agent_field_problems_total",
		Help: "Fields of Calico resources (IPPool modes, Node addresses and tunnel endpoints, FelixConfiguration tunnel settings) that cannot be used as written, counted once per resource and problem when it appears, by kind and field.",
	}, []string{"kind", "field"})
	ownership := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vpp_route_agent_ownership_source",
		Help: "1 for the source block owners are read from (blocks or affinities: --ownership), 0 for the other.",
	}, []string{"source"})
	for _, c := range []prometheus.Collector{events, relists, malformed, problems, ownership} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register blockwatch metrics: %w", err)
		}
	}
	m := &metrics{relists: relists, problems: problems, ownership: ownership}
	m.setOwnership(OwnershipBlocks)
	for src := range numSources {
		m.events[src][mvccpb.PUT] = events.WithLabelValues(src.String(), "put")
		m.events[src][mvccpb.DELETE] = events.WithLabelValues(src.String(), "delete")
		m.malformed[src] = malformed.WithLabelValues(src.String())
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

func (m *metrics) malformedValue(src source) {
	if m != nil {
		m.malformed[src].Inc()
	}
}

// fieldProblem counts a problem of a resource's field. The labels are bounded: the kinds and the
// fields calico reports are fixed sets once list indexes are dropped ("spec.addresses[3].address"
// counts as "spec.addresses[].address"); the resource's name is never a label.
func (m *metrics) fieldProblem(kind, field string) {
	if m != nil {
		m.problems.WithLabelValues(kind, fieldLabel(field)).Inc()
	}
}

// fieldLabel drops the indexes of a JSON path's list elements.
func fieldLabel(field string) string {
	var b strings.Builder
	inIndex := false
	for _, r := range field {
		switch {
		case r == '[':
			inIndex = true
			b.WriteRune(r)
		case r == ']':
			inIndex = false
			b.WriteRune(r)
		case !inIndex:
			b.WriteRune(r)
		}
	}
	return b.String()
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
