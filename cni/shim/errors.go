package shim

import "encoding/json"

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

// JSON returns the error as the CNI library prints it: indented by four spaces, no trailing newline.
func (e *Error) JSON() []byte {
	out, _ := json.MarshalIndent(e, "", "    ")
	return out
}

// CNI error codes the plugin returns on its own, without the daemon.
const (
	ErrIOFailure            uint = 5
	ErrInvalidNetworkConfig uint = 7
	ErrTryAgainLater        uint = 11
	ErrPluginNotAvailable   uint = 50
	ErrInternal             uint = 999
)
