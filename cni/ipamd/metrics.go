package ipamd

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the daemon's Prometheus metrics. Label values are verbs and CNI result codes: bounded,
// never per container or per block.
type metrics struct {
	requests   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	roundTrips *prometheus.CounterVec
	claims     prometheus.Counter
	outside    prometheus.Counter
	batched    *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	refused    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "block_ipam_requests_total",
			Help: "CNI requests answered, by verb and result (ok, or the CNI error code).",
		}, []string{"verb", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "block_ipam_request_duration_seconds",
			Help:    "Time from a request's arrival on the socket to its reply, queueing included.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"verb"}),
		roundTrips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "block_ipam_etcd_round_trips_total",
			Help: "etcd transactions sent, by the verb of the operation that sent them.",
		}, []string{"verb"}),
		claims: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "block_ipam_block_claims_total",
			Help: "IPAM blocks this node claimed (created with its affinity).",
		}),
		outside: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "block_ipam_blocks_outside_pools_total",
			Help: "Blocks found outside every IP pool, each counted once: claims ignore them, as Calico's do.",
		}),
		batched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "block_ipam_batched_requests_total",
			Help: "Requests served by the etcd transaction of another request of the same verb, by verb.",
		}, []string{"verb"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "block_ipam_connections_dropped_total",
			Help: "Connections on the socket closed without serving a request, by reason: displaced (still sending its request when a new connection came at the connection limit), bytes (refused with 11: the request buffers were full), deadline (no whole request within the read deadline).",
		}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "block_ipam_claims_refused_total",
			Help: "ADD operations answered 100 (pool exhausted) because the node could get no block, by reason: block_limit (maxBlocksPerHost reached, all full), auto_allocate_off, strict_affinity (no block to claim, borrowing forbidden), pool_exhausted (no block to claim, nothing to borrow).",
		}, []string{"reason"}),
	}
	for _, reason := range refusalReasons {
		m.refused.WithLabelValues(reason)
	}
	for _, reason := range []string{"displaced", "bytes", "deadline"} {
		m.dropped.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency, m.roundTrips, m.claims, m.outside, m.batched, m.dropped, m.refused)
	}
	return m
}

func promhttpHandler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}
