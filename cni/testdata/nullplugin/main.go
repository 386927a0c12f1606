// Command nullplugin is the benchmark's floor: a CNI IPAM plugin in Go that does no IPAM work at all.
// It reads its configuration, answers ADD with an address made from the container ID (distinct for the
// benchmark's IDs, stored nowhere) and every other command with nothing. What a burst of it costs is
// what any plugin written in Go and executed once per call costs before doing anything: the process,
// the Go runtime's start, and the runtime's (here libcni's) work around it.
package main

import (
	"io"
	"os"
)

func main() {
	io.Copy(io.Discard, os.Stdin)
	switch os.Getenv("CNI_COMMAND") {
	case "VERSION":
		os.Stdout.WriteString(`{"cniVersion":"1.1.0","supportedVersions":["1.1.0"]}`)
	case "ADD":
		// FNV-1a of the container ID, as the low 24 bits of an address in 10.0.0.0/8.
		h := uint32(2166136261)
		for _, c := range []byte(os.Getenv("CNI_CONTAINERID")) {
			h = (h ^ uint32(c)) * 16777619
		}
		os.Stdout.WriteString(`{"cniVersion":"1.1.0","ips":[{"address":"10.` + itoa(h>>16&0xff) + "." + itoa(h>>8&0xff) + "." + itoa(h&0xff) + `/32"}]}`)
	}
}

func itoa(v uint32) string {
	if v < 10 {
		return string(rune('0' + v))
	}
	return itoa(v/10) + string(rune('0'+v%10))
}
