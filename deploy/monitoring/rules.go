package monitoring

import _ "embed"

// Rules is rules.yml, the shipped alert rules, for programs that run a Prometheus of their own (the
// lab, cmd/vpplab): they load exactly what an operator deploys.
//
//go:embed rules.yml
var Rules []byte
