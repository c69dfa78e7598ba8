package gcp

import (
	"context"
	"testing"

	"google.golang.org/api/option"
)

// TestCloseOfAPartlyBuiltSDK: Close skips the clients never built (NewSDK
// closes what it built when a later client fails), and closes the others.
func TestCloseOfAPartlyBuiltSDK(t *testing.T) {
	if err := (&sdk{}).Close(); err != nil {
		t.Errorf("Close of an sdk with no clients = %v; want nil", err)
	}
	api, err := NewSDK(context.Background(), "p", option.WithEndpoint("http://127.0.0.1:1"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	s := api.(*sdk) //nolint:forcetypeassert // NewSDK's API is an *sdk.
	s.firewalls, s.regions = nil, nil
	if err := s.Close(); err != nil {
		t.Errorf("Close of an sdk without its last clients = %v; want nil", err)
	}
}
