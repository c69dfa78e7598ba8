package proxmox

import (
	"context"
	"errors"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/attribute"

	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Observe wraps api so every call is one client span
// ("proxmox.<Method>", a child of the caller's) and one V(1) log line
// ("proxmox api call") with the call, its node, VMID and UPID, its
// duration, HTTP status and error. It is applied once, in New, so driver
// code never holds an undecorated seam. Attributes and log lines carry
// identifiers only: never the token, a config body or an upload.
// server is the API's host:port, for the spans' server.address and
// server.port.
func Observe(api API, server string, logger func(context.Context) logr.Logger) API {
	return &observed{next: api, server: telemetry.ServerAttributes(server), logger: logger}
}

type observed struct {
	next   API
	server []attribute.KeyValue
	logger func(context.Context) logr.Logger
}

// call runs fn inside the span and logs its outcome; upid is what fn
// returned when it started a task.
func (o *observed) call(ctx context.Context, name, node string, vmid int, fn func(ctx context.Context) (upid string, err error)) error {
	attrs := append([]attribute.KeyValue{attribute.String("proxmox.call", name)}, o.server...)
	var kv []any
	if node != "" {
		attrs = append(attrs, attribute.String("proxmox.node", node))
		kv = append(kv, "node", node)
	}
	if vmid != 0 {
		attrs = append(attrs, attribute.Int("proxmox.vmid", vmid))
		kv = append(kv, "vmid", vmid)
	}
	ctx, c := telemetry.StartCall(ctx, nil, "proxmox", name, "proxmox."+name, attrs...)
	upid, err := fn(ctx)
	if upid != "" {
		c.SetAttributes(attribute.String("proxmox.upid", upid))
		kv = append(kv, "upid", upid)
	}
	class := telemetry.ErrorClass(err)
	var ae *APIError
	if errors.As(err, &ae) {
		c.SetAttributes(attribute.Int("http.response.status_code", ae.Status))
		kv = append(kv, "httpStatus", ae.Status)
		class = telemetry.HTTPErrorClass(ae.Status)
	}
	c.EndClass(o.logger(ctx), "proxmox api call", err, class, kv...)
	return err
}

func (o *observed) Version(ctx context.Context) (v Version, err error) {
	err = o.call(ctx, "Version", "", 0, func(ctx context.Context) (string, error) {
		v, err = o.next.Version(ctx)
		return "", err
	})
	return v, err
}

func (o *observed) Resources(ctx context.Context, typ string) (r []Resource, err error) {
	err = o.call(ctx, "Resources"+typeSuffix(typ), "", 0, func(ctx context.Context) (string, error) {
		r, err = o.next.Resources(ctx, typ)
		return "", err
	})
	return r, err
}

func typeSuffix(typ string) string {
	if typ == "" {
		return ""
	}
	return "(" + typ + ")"
}

func (o *observed) NodeStatus(ctx context.Context, node string) (s NodeStatus, err error) {
	err = o.call(ctx, "NodeStatus", node, 0, func(ctx context.Context) (string, error) {
		s, err = o.next.NodeStatus(ctx, node)
		return "", err
	})
	return s, err
}

func (o *observed) StorageStatus(ctx context.Context, node, storage string) (s StorageStatus, err error) {
	err = o.call(ctx, "StorageStatus", node, 0, func(ctx context.Context) (string, error) {
		s, err = o.next.StorageStatus(ctx, node, storage)
		return "", err
	})
	return s, err
}

func (o *observed) ISOs(ctx context.Context, node, storage string) (v []Volume, err error) {
	err = o.call(ctx, "ISOs", node, 0, func(ctx context.Context) (string, error) {
		v, err = o.next.ISOs(ctx, node, storage)
		return "", err
	})
	return v, err
}

func (o *observed) Upload(ctx context.Context, node, storage, filename string, data []byte) (upid string, err error) {
	err = o.call(ctx, "Upload", node, 0, func(ctx context.Context) (string, error) {
		upid, err = o.next.Upload(ctx, node, storage, filename, data)
		return upid, err
	})
	return upid, err
}

func (o *observed) DeleteVolume(ctx context.Context, node, volid string) (upid string, err error) {
	err = o.call(ctx, "DeleteVolume", node, 0, func(ctx context.Context) (string, error) {
		upid, err = o.next.DeleteVolume(ctx, node, volid)
		return upid, err
	})
	return upid, err
}

func (o *observed) VMConfig(ctx context.Context, node string, vmid int) (c VMConfig, err error) {
	err = o.call(ctx, "VMConfig", node, vmid, func(ctx context.Context) (string, error) {
		c, err = o.next.VMConfig(ctx, node, vmid)
		return "", err
	})
	return c, err
}

func (o *observed) SetVMConfig(ctx context.Context, node string, vmid int, u ConfigUpdate) error {
	return o.call(ctx, "SetVMConfig", node, vmid, func(ctx context.Context) (string, error) {
		return "", o.next.SetVMConfig(ctx, node, vmid, u)
	})
}

func (o *observed) Clone(ctx context.Context, node string, vmid int, p CloneParams) (upid string, err error) {
	err = o.call(ctx, "Clone", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Clone(ctx, node, vmid, p)
		return upid, err
	})
	return upid, err
}

func (o *observed) Resize(ctx context.Context, node string, vmid int, disk, size string) (upid string, err error) {
	err = o.call(ctx, "Resize", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Resize(ctx, node, vmid, disk, size)
		return upid, err
	})
	return upid, err
}

func (o *observed) Start(ctx context.Context, node string, vmid int) (upid string, err error) {
	err = o.call(ctx, "Start", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Start(ctx, node, vmid)
		return upid, err
	})
	return upid, err
}

func (o *observed) Stop(ctx context.Context, node string, vmid int) (upid string, err error) {
	err = o.call(ctx, "Stop", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Stop(ctx, node, vmid)
		return upid, err
	})
	return upid, err
}

func (o *observed) Reboot(ctx context.Context, node string, vmid int) (upid string, err error) {
	err = o.call(ctx, "Reboot", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Reboot(ctx, node, vmid)
		return upid, err
	})
	return upid, err
}

func (o *observed) Destroy(ctx context.Context, node string, vmid int) (upid string, err error) {
	err = o.call(ctx, "Destroy", node, vmid, func(ctx context.Context) (string, error) {
		upid, err = o.next.Destroy(ctx, node, vmid)
		return upid, err
	})
	return upid, err
}

func (o *observed) VMStatus(ctx context.Context, node string, vmid int) (s VMStatus, err error) {
	err = o.call(ctx, "VMStatus", node, vmid, func(ctx context.Context) (string, error) {
		s, err = o.next.VMStatus(ctx, node, vmid)
		return "", err
	})
	return s, err
}

func (o *observed) AgentInterfaces(ctx context.Context, node string, vmid int) (i []Interface, err error) {
	err = o.call(ctx, "AgentInterfaces", node, vmid, func(ctx context.Context) (string, error) {
		i, err = o.next.AgentInterfaces(ctx, node, vmid)
		return "", err
	})
	return i, err
}

func (o *observed) TaskLog(ctx context.Context, node, upid string) (l []string, err error) {
	err = o.call(ctx, "TaskLog", node, 0, func(ctx context.Context) (string, error) {
		l, err = o.next.TaskLog(ctx, node, upid)
		return upid, err
	})
	return l, err
}

func (o *observed) Tasks(ctx context.Context, node string, vmid int) (t []Task, err error) {
	err = o.call(ctx, "Tasks", node, vmid, func(ctx context.Context) (string, error) {
		t, err = o.next.Tasks(ctx, node, vmid)
		return "", err
	})
	return t, err
}
