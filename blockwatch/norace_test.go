//go:build !race

package blockwatch

const raceEnabled = false
