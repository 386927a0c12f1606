package shim

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
)

// minVersion is the configuration's lowest cniVersion each verb allows (skel's; "" for any): the
// verbs a plugin of spec 1.1 serves.
var minVersion = map[string]string{"ADD": "", "DEL": "", "CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}

// CheckVersion is skel's (containernetworking/cni v1.3.0) check of the command and of the
// configuration's cniVersion, with its codes and words, for a configuration that is a JSON object
// with a valid name: an unknown command is 4; a configuration older than the verb allows, or not
// among Versions, is 1; a cniVersion that is not a version is 6. Its order is skel's: the command,
// the verb's minimum, then the exact version.
func CheckVersion(cmd string, stdin []byte) *Error {
	minimum, known := minVersion[cmd]
	if !known {
		return &Error{Code: ErrInvalidEnvironment, Msg: "unknown CNI_COMMAND: " + cmd}
	}
	// skel's version.ConfigDecoder, an anonymous struct: its errors read the same.
	var conf struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return &Error{Code: ErrDecodingFailure, Msg: "decoding version from network config: " + err.Error()}
	}
	configVersion := conf.CNIVersion
	if configVersion == "" {
		configVersion = "0.1.0"
	}
	if minimum != "" {
		ok, err := greaterOrEqual(configVersion, minimum)
		if err != nil {
			return &Error{Code: ErrDecodingFailure, Msg: err.Error()}
		}
		if !ok {
			return &Error{Code: ErrIncompatibleCNIVersion, Msg: "config version does not allow " + cmd}
		}
		supported := false
		for _, v := range Versions {
			if supported, err = greaterOrEqual(v, configVersion); err != nil {
				return &Error{Code: ErrDecodingFailure, Msg: err.Error()}
			} else if supported {
				break
			}
		}
		if !supported {
			return &Error{Code: ErrIncompatibleCNIVersion, Msg: "plugin version does not allow " + cmd}
		}
	}
	for _, v := range Versions {
		if v == configVersion {
			return nil
		}
	}
	quoted := make([]string, len(Versions))
	for i, v := range Versions {
		quoted[i] = strconv.Quote(v)
	}
	return &Error{Code: ErrIncompatibleCNIVersion, Msg: "incompatible CNI versions",
		Details: "config is " + strconv.Quote(configVersion) + ", plugin supports [" + strings.Join(quoted, " ") + "]"}
}

// greaterOrEqual is the CNI library's version.GreaterThanOrEqualTo: "major[.minor[.micro]]", each
// part a decimal integer, compared in order.
func greaterOrEqual(v, other string) (bool, error) {
	a, err := parseVersion(v)
	if err != nil {
		return false, err
	}
	b, err := parseVersion(other)
	if err != nil {
		return false, err
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i], nil
		}
	}
	return true, nil
}

// parseVersion is the CNI library's version.ParseVersion, with its messages.
func parseVersion(v string) ([3]int, error) {
	if v == "" {
		return [3]int{0, 1, 0}, nil
	}
	parts := strings.Split(v, ".")
	if len(parts) >= 4 {
		return [3]int{}, errors.New("invalid version " + strconv.Quote(v) + ": too many parts")
	}
	var out [3]int
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return [3]int{}, errors.New("failed to convert " + [...]string{"major", "minor", "micro"}[i] + " version part " + strconv.Quote(p) + ": " + err.Error())
		}
		out[i] = n
	}
	return out, nil
}
