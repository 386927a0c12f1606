package shim

import (
	"encoding/json"
	"strings"
	"unicode"
)

// Error is a CNI error as the plugin prints it. Its JSON is that of the CNI library's types.Error.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + "; " + e.Details
}

// JSON returns the error as skel prints it: indented by four spaces, no trailing newline.
func (e *Error) JSON() []byte {
	out, _ := json.MarshalIndent(e, "", "    ")
	return out
}

// CNI error codes the plugin returns on its own.
const (
	ErrIncompatibleCNIVersion uint = 1
	ErrInvalidEnvironment     uint = 4
	ErrIOFailure              uint = 5
	ErrDecodingFailure        uint = 6
	ErrInvalidNetworkConfig   uint = 7
	ErrTryAgainLater          uint = 11
	ErrPluginNotAvailable     uint = 50
	ErrInternal               uint = 999
)

// maxInterfaceNameLength is Linux's IFNAMSIZ less the terminating zero.
const maxInterfaceNameLength = 15

// envVar is one CNI environment variable and the verbs that require it.
type envVar struct {
	name     string
	required []string
	validate func(string) *Error
}

// envVars are skel's (containernetworking/cni v1.3.0), in its order: the first invalid value is
// reported, else every missing variable.
var envVars = []envVar{
	{"CNI_COMMAND", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_CONTAINERID", []string{"ADD", "CHECK", "DEL"}, validateContainerID},
	{"CNI_NETNS", []string{"ADD", "CHECK"}, nil},
	{"CNI_IFNAME", []string{"ADD", "CHECK", "DEL"}, validateInterfaceName},
	{"CNI_ARGS", nil, nil},
	{"CNI_PATH", []string{"ADD", "CHECK", "DEL", "GC", "STATUS"}, nil},
	{"CNI_NETNS_OVERRIDE", nil, nil},
}

// CheckEnv checks the CNI environment as skel does before it reads stdin and returns the command.
func CheckEnv(getenv func(string) string) (string, *Error) {
	cmd := getenv("CNI_COMMAND")
	var missing []string
	for _, v := range envVars {
		val := getenv(v.name)
		required := false
		for _, c := range v.required {
			required = required || c == cmd
		}
		switch {
		case val == "":
			if required || v.name == "CNI_COMMAND" {
				missing = append(missing, v.name)
			}
		case required && v.validate != nil:
			if err := v.validate(val); err != nil {
				return "", err
			}
		}
	}
	if len(missing) > 0 {
		return "", &Error{Code: ErrInvalidEnvironment, Msg: "required env variables [" + strings.Join(missing, ",") + "] missing"}
	}
	return cmd, nil
}

// ValidName reports whether s matches the CNI library's pattern for container IDs and network
// names, ^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$.
func ValidName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '.' || c == '-'):
		default:
			return false
		}
	}
	return s != ""
}

// validateContainerID is the CNI library's utils.ValidateContainerID for a non-empty ID.
func validateContainerID(id string) *Error {
	if !ValidName(id) {
		return &Error{Code: ErrInvalidEnvironment, Msg: "invalid characters in containerID", Details: id}
	}
	return nil
}

// validateInterfaceName is the CNI library's utils.ValidateInterfaceName.
func validateInterfaceName(name string) *Error {
	switch {
	case name == "":
		return &Error{Code: ErrInvalidEnvironment, Msg: "interface name is empty"}
	case len(name) > maxInterfaceNameLength:
		return &Error{Code: ErrInvalidEnvironment, Msg: "interface name is too long", Details: "interface name should be less than 16 characters"}
	case name == "." || name == "..":
		return &Error{Code: ErrInvalidEnvironment, Msg: "interface name is . or .."}
	}
	for _, r := range []rune(name) {
		if r == '/' || r == ':' || unicode.IsSpace(r) {
			return &Error{Code: ErrInvalidEnvironment, Msg: "interface name contains / or : or whitespace characters"}
		}
	}
	return nil
}
