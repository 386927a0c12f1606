package vppapi

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"go.fd.io/govpp/api"
)

// TestReplyErrorEveryReply: replyError turns the retval of every reply this package receives into an
// error, so that no request's failure is taken for success (sw_interface_tag_add_del's was, before
// replyError checked a reply it did not list).
func TestReplyErrorEveryReply(t *testing.T) {
	n := 0
	for _, m := range slices.Concat(usedMessages(), tunnelMessages(), routeSourceMessages(), interfaceEventMessages(),
		neighborMessages(), vxlanMessages()) {
		typ := reflect.TypeOf(m).Elem()
		f, ok := typ.FieldByName("Retval")
		if m.GetMessageType() != api.ReplyMessage || !ok || f.Type.Kind() != reflect.Int32 {
			continue
		}
		reply := reflect.New(typ)
		reply.Elem().FieldByName("Retval").SetInt(int64(api.INVALID_VALUE))
		if err := replyError(reply.Interface().(api.Message)); !errors.Is(err, api.INVALID_VALUE) {
			t.Errorf("replyError(%s with retval -7) = %v", m.GetMessageName(), err)
		}
		n++
	}
	if n < 15 {
		t.Errorf("only %d replies with a retval checked", n)
	}
}
