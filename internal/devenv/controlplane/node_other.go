//go:build !linux

package controlplane

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// NodeOptions configures the node Start runs with Options.Node (Linux only).
type NodeOptions struct {
	BinDir      string
	Images      []string
	RegistryCAs map[string][]byte
}

// Node is the node of a control plane (Linux only).
type Node struct {
	Name, Dir, Bridge, ContainerdSocket, BinDir string
	PodCIDR                                     netip.Prefix
	Gateway                                     netip.Addr
	ReadyIn, ImportIn                           time.Duration
}

func (c *ControlPlane) prepareNode(context.Context, *NodeOptions, *envtest.APIServer) (*Node, error) {
	return nil, errors.New("a node runs on Linux only")
}

func (n *Node) start(context.Context, *NodeOptions) error {
	return errors.New("a node runs on Linux only")
}
func (n *Node) stop() error { return nil }

// Leftovers is empty off Linux.
func Leftovers() []string { return nil }

// LockNode has nothing to lock off Linux.
func LockNode(context.Context) (func(), error) { return func() {}, nil }
