package calico

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CheckNodeName reports whether name can name a node in Calico's keys
// (/calico/ipam/v2/host/<name>/...) and in "host:<name>" affinities: one key segment, printable.
func CheckNodeName(name string) error {
	switch {
	case name == "":
		return errors.New("node name is empty")
	case name == "." || name == "..":
		return fmt.Errorf("node name %q is not a name", name)
	case len(name) > 253:
		return fmt.Errorf("node name is %d bytes long, more than 253", len(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("node name %q is not UTF-8", name)
	case strings.ContainsRune(name, '/'):
		return fmt.Errorf("node name %q contains '/', which would make it several etcd key segments", name)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("node name %q contains a control or space character (%U)", name, r)
		}
	}
	return nil
}
