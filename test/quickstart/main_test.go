//go:build linux

package quickstart_test

import (
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
