//go:build !race

package vppsim

const raceEnabled = false
