package vppapi

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the package's Prometheus metrics. A nil *metrics records nothing, so a Client built without
// a Registerer needs no checks at the call sites.
type metrics struct {
	connected  prometheus.Gauge
	reconnects prometheus.Counter
	apiErrors  *prometheus.CounterVec
	bfdLost    prometheus.Counter
}

// newMetrics registers the metrics with reg; a nil reg means no metrics.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vpp_route_agent_vpp_connected",
			Help: "1 while connected to a compatible VPP over the binary API and it answers (0 from a request left unanswered for the reply timeout with no other reply meanwhile), else 0.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpp_route_agent_vpp_reconnects_total",
			Help: "Connections to VPP established after the first one.",
		}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vpp_route_agent_vpp_api_errors_total",
			Help: "VPP binary API requests that failed with a non-zero retval or got no reply in time, by request message.",
		}, []string{"msg"}),
		bfdLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vpp_route_agent_bfd_events_lost_total",
			Help: "BFD state events from VPP dropped because their consumer fell behind; each is followed by a re-read of the sessions.",
		}),
	}
	for _, c := range []prometheus.Collector{m.connected, m.reconnects, m.apiErrors, m.bfdLost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register vppapi metrics: %w", err)
		}
	}
	// Export every request's series from the start, at zero, so rates work before the first error.
	for _, msg := range requestMessageNames() {
		m.apiErrors.WithLabelValues(msg)
	}
	return m, nil
}

func (m *metrics) setConnected(up bool) {
	if m == nil {
		return
	}
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}

func (m *metrics) reconnected() {
	if m != nil {
		m.reconnects.Inc()
	}
}

// apiError counts one failed request of message msg.
func (m *metrics) apiError(msg string) {
	if m != nil {
		m.apiErrors.WithLabelValues(msg).Inc()
	}
}

// bfdEventLost counts one dropped BFD event.
func (m *metrics) bfdEventLost() {
	if m != nil {
		m.bfdLost.Inc()
	}
}

// apiErrorsN counts n failed requests of message msg.
func (m *metrics) apiErrorsN(msg string, n int) {
	if m != nil && n > 0 {
		m.apiErrors.WithLabelValues(msg).Add(float64(n))
	}
}
