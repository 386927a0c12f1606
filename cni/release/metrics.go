package release

import "github.com/prometheus/client_golang/prometheus"

// newReleasesCounter is block_ipam_node_releases_total, its results present from the start (at 0),
// so that an alert on increase() sees the first one.
func newReleasesCounter() *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "block_ipam_node_releases_total",
		Help: "Automatic releases of dead nodes' addresses (--release-dead-nodes-after), by result: released, partial (values that cannot be read left, named in the record), aborted (the node came back or something changed: not released), failed (etcd error, retried).",
	}, []string{"result"})
	for _, res := range []string{ResultReleased, ResultPartial, ResultAborted, ResultFailed} {
		c.WithLabelValues(res)
	}
	return c
}
