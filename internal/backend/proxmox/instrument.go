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
func (o *observed) call(ctx context.Context, name, node string, vmid int, fn func(ctx context.Context) (upid string, err error)) (string, error) {
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
	return upid, err
}

// read is call for a request that starts no task and answers v.
func read[T any](o *observed, ctx context.Context, name, node string, vmid int, fn func(context.Context) (T, error)) (v T, err error) {
	_, err = o.call(ctx, name, node, vmid, func(ctx context.Context) (string, error) {
		v, err = fn(ctx)
		return "", err
	})
	return v, err
}

// readVM is read for a request about one VM.
func readVM[T any](o *observed, ctx context.Context, name, node string, vmid int, fn func(context.Context, string, int) (T, error)) (T, error) {
	return read(o, ctx, name, node, vmid, func(ctx context.Context) (T, error) { return fn(ctx, node, vmid) })
}

// taskVM is call for a request that starts a task on one VM.
func (o *observed) taskVM(ctx context.Context, name, node string, vmid int, fn func(context.Context, string, int) (string, error)) (string, error) {
	return o.call(ctx, name, node, vmid, func(ctx context.Context) (string, error) { return fn(ctx, node, vmid) })
}

func (o *observed) Version(ctx context.Context) (Version, error) {
	return read(o, ctx, "Version", "", 0, o.next.Version)
}

func (o *observed) Resources(ctx context.Context, typ string) ([]Resource, error) {
	return read(o, ctx, "Resources"+typeSuffix(typ), "", 0, func(ctx context.Context) ([]Resource, error) { return o.next.Resources(ctx, typ) })
}

func typeSuffix(typ string) string {
	if typ == "" {
		return ""
	}
	return "(" + typ + ")"
}

func (o *observed) NodeStatus(ctx context.Context, node string) (NodeStatus, error) {
	return read(o, ctx, "NodeStatus", node, 0, func(ctx context.Context) (NodeStatus, error) { return o.next.NodeStatus(ctx, node) })
}

func (o *observed) NodeNetwork(ctx context.Context, node string) ([]NodeInterface, error) {
	return read(o, ctx, "NodeNetwork", node, 0, func(ctx context.Context) ([]NodeInterface, error) { return o.next.NodeNetwork(ctx, node) })
}

func (o *observed) StorageStatus(ctx context.Context, node, storage string) (StorageStatus, error) {
	return read(o, ctx, "StorageStatus", node, 0, func(ctx context.Context) (StorageStatus, error) { return o.next.StorageStatus(ctx, node, storage) })
}

func (o *observed) ISOs(ctx context.Context, node, storage string) ([]Volume, error) {
	return read(o, ctx, "ISOs", node, 0, func(ctx context.Context) ([]Volume, error) { return o.next.ISOs(ctx, node, storage) })
}

func (o *observed) Upload(ctx context.Context, node, storage, filename string, data []byte) (string, error) {
	return o.call(ctx, "Upload", node, 0, func(ctx context.Context) (string, error) { return o.next.Upload(ctx, node, storage, filename, data) })
}

func (o *observed) DeleteVolume(ctx context.Context, node, volid string) (string, error) {
	return o.call(ctx, "DeleteVolume", node, 0, func(ctx context.Context) (string, error) { return o.next.DeleteVolume(ctx, node, volid) })
}

func (o *observed) SetVMConfig(ctx context.Context, node string, vmid int, u ConfigUpdate) error {
	_, err := o.call(ctx, "SetVMConfig", node, vmid, func(ctx context.Context) (string, error) { return "", o.next.SetVMConfig(ctx, node, vmid, u) })
	return err
}

func (o *observed) Clone(ctx context.Context, node string, vmid int, p CloneParams) (string, error) {
	return o.call(ctx, "Clone", node, vmid, func(ctx context.Context) (string, error) { return o.next.Clone(ctx, node, vmid, p) })
}

func (o *observed) Resize(ctx context.Context, node string, vmid int, disk, size string) (string, error) {
	return o.call(ctx, "Resize", node, vmid, func(ctx context.Context) (string, error) { return o.next.Resize(ctx, node, vmid, disk, size) })
}

func (o *observed) Start(ctx context.Context, node string, vmid int) (string, error) {
	return o.taskVM(ctx, "Start", node, vmid, o.next.Start)
}

func (o *observed) Stop(ctx context.Context, node string, vmid int) (string, error) {
	return o.taskVM(ctx, "Stop", node, vmid, o.next.Stop)
}

func (o *observed) Reboot(ctx context.Context, node string, vmid int) (string, error) {
	return o.taskVM(ctx, "Reboot", node, vmid, o.next.Reboot)
}

func (o *observed) Destroy(ctx context.Context, node string, vmid int) (string, error) {
	return o.taskVM(ctx, "Destroy", node, vmid, o.next.Destroy)
}

func (o *observed) VMConfig(ctx context.Context, node string, vmid int) (VMConfig, error) {
	return readVM(o, ctx, "VMConfig", node, vmid, o.next.VMConfig)
}

func (o *observed) VMStatus(ctx context.Context, node string, vmid int) (VMStatus, error) {
	return readVM(o, ctx, "VMStatus", node, vmid, o.next.VMStatus)
}

func (o *observed) AgentInterfaces(ctx context.Context, node string, vmid int) ([]Interface, error) {
	return readVM(o, ctx, "AgentInterfaces", node, vmid, o.next.AgentInterfaces)
}

// AgentFileRead records the call, never the file's content.
func (o *observed) AgentFileRead(ctx context.Context, node string, vmid int, file string) (string, bool, error) {
	type result struct {
		content   string
		truncated bool
	}
	r, err := read(o, ctx, "AgentFileRead", node, vmid, func(ctx context.Context) (result, error) {
		c, t, err := o.next.AgentFileRead(ctx, node, vmid, file)
		return result{c, t}, err
	})
	return r.content, r.truncated, err
}

func (o *observed) Tasks(ctx context.Context, node string, vmid int) ([]Task, error) {
	return readVM(o, ctx, "Tasks", node, vmid, o.next.Tasks)
}

// TaskLog reports the task's UPID on its span, as a task's start does.
func (o *observed) TaskLog(ctx context.Context, node, upid string) (l []string, err error) {
	_, err = o.call(ctx, "TaskLog", node, 0, func(ctx context.Context) (string, error) {
		l, err = o.next.TaskLog(ctx, node, upid)
		return upid, err
	})
	return l, err
}
