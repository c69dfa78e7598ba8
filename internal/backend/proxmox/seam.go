package proxmox

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
)

// API is the seam between the driver and Proxmox VE: exactly the calls
// the driver makes, one method per endpoint, ctx first. Methods that
// start a task return its UPID without waiting for it. Errors are
// *APIError for answers the server gave, and the transport's own errors
// otherwise; classify turns both into proxy error classes.
//
// Client is the production implementation; Observe wraps one with spans
// and call logs; tests put pvetest's fake server behind a Client.
type API interface {
	// Version is GET /version.
	Version(ctx context.Context) (Version, error)
	// Resources is GET /cluster/resources, every node's guests, storages
	// and nodes (typ "vm", "storage", "node", or "" for all).
	Resources(ctx context.Context, typ string) ([]Resource, error)
	// NodeStatus is GET /nodes/{node}/status.
	NodeStatus(ctx context.Context, node string) (NodeStatus, error)
	// NodeNetwork is GET /nodes/{node}/network, the node's interfaces as
	// its network configuration states them.
	NodeNetwork(ctx context.Context, node string) ([]NodeInterface, error)
	// StorageStatus is GET /nodes/{node}/storage/{storage}/status.
	StorageStatus(ctx context.Context, node, storage string) (StorageStatus, error)
	// ISOs is GET /nodes/{node}/storage/{storage}/content?content=iso.
	ISOs(ctx context.Context, node, storage string) ([]Volume, error)
	// Upload is POST /nodes/{node}/storage/{storage}/upload of an ISO,
	// with its SHA-256 so a cut-off upload fails its task.
	Upload(ctx context.Context, node, storage, filename string, data []byte) (string, error)
	// DeleteVolume is DELETE /nodes/{node}/storage/{storage}/content/{volume}.
	DeleteVolume(ctx context.Context, node, volid string) (string, error)
	// VMConfig is GET /nodes/{node}/qemu/{vmid}/config.
	VMConfig(ctx context.Context, node string, vmid int) (VMConfig, error)
	// SetVMConfig is PUT /nodes/{node}/qemu/{vmid}/config (synchronous).
	SetVMConfig(ctx context.Context, node string, vmid int, u ConfigUpdate) error
	// Clone is POST /nodes/{node}/qemu/{vmid}/clone.
	Clone(ctx context.Context, node string, vmid int, p CloneParams) (string, error)
	// Resize is PUT /nodes/{node}/qemu/{vmid}/resize to an absolute size.
	Resize(ctx context.Context, node string, vmid int, disk, size string) (string, error)
	// Start is POST /nodes/{node}/qemu/{vmid}/status/start.
	Start(ctx context.Context, node string, vmid int) (string, error)
	// Stop is POST /nodes/{node}/qemu/{vmid}/status/stop.
	Stop(ctx context.Context, node string, vmid int) (string, error)
	// Reboot is POST /nodes/{node}/qemu/{vmid}/status/reboot.
	Reboot(ctx context.Context, node string, vmid int) (string, error)
	// Destroy is DELETE /nodes/{node}/qemu/{vmid} with purge=1 and
	// destroy-unreferenced-disks=1.
	Destroy(ctx context.Context, node string, vmid int) (string, error)
	// VMStatus is GET /nodes/{node}/qemu/{vmid}/status/current.
	VMStatus(ctx context.Context, node string, vmid int) (VMStatus, error)
	// AgentInterfaces is GET
	// /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces.
	AgentInterfaces(ctx context.Context, node string, vmid int) ([]Interface, error)
	// AgentFileRead is GET /nodes/{node}/qemu/{vmid}/agent/file-read:
	// the content of a file of the guest, and whether it was truncated.
	AgentFileRead(ctx context.Context, node string, vmid int, file string) (content string, truncated bool, err error)
	// TaskLog is GET /nodes/{node}/tasks/{upid}/log (its lines).
	TaskLog(ctx context.Context, node, upid string) ([]string, error)
	// Tasks is GET /nodes/{node}/tasks?vmid=...&source=all: the node's
	// running and recent tasks whose ID is vmid, newest first.
	Tasks(ctx context.Context, node string, vmid int) ([]Task, error)
}

// Bool reads the API's booleans, which arrive as 0/1, true/false or
// "1".
type Bool bool

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bool) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	*b = Bool(s == "1" || s == "true")
	return nil
}

// Resource is one entry of /cluster/resources.
type Resource struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Node     string `json:"node"`
	Status   string `json:"status"`
	Name     string `json:"name"`
	VMID     int    `json:"vmid"`
	Template Bool   `json:"template"`
	Lock     string `json:"lock"`
	Tags     string `json:"tags"`
	Uptime   int64  `json:"uptime"`
	Storage  string `json:"storage"`
	Content  string `json:"content"`
}

// Version is /version.
type Version struct {
	Version string `json:"version"`
	Release string `json:"release"`
	RepoID  string `json:"repoid"`
}

// NodeStatus is the part of /nodes/{node}/status the health check
// reports.
type NodeStatus struct {
	PVEVersion    string `json:"pveversion"`
	CurrentKernel struct {
		Release string `json:"release"`
	} `json:"current-kernel"`
}

// NodeInterface is the part of one entry of /nodes/{node}/network that
// states the node's own addresses.
type NodeInterface struct {
	Iface    string `json:"iface"`
	Address  string `json:"address"`
	Address6 string `json:"address6"`
	CIDR     string `json:"cidr"`
	CIDR6    string `json:"cidr6"`
}

// StorageStatus is /nodes/{node}/storage/{storage}/status.
type StorageStatus struct {
	Type    string `json:"type"`
	Content string `json:"content"`
	Active  Bool   `json:"active"`
	Enabled Bool   `json:"enabled"`
	Shared  Bool   `json:"shared"`
	Total   int64  `json:"total"`
	Avail   int64  `json:"avail"`
}

// Volume is one entry of a storage's content.
type Volume struct {
	VolID string `json:"volid"`
	Size  int64  `json:"size"`
	CTime int64  `json:"ctime"`
}

// VMConfig is a VM's configuration, every value as text (the API sends
// numbers for some keys).
type VMConfig map[string]string

// UnmarshalJSON implements json.Unmarshaler.
func (c *VMConfig) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	out := VMConfig{}
	for k, v := range raw {
		var s string
		if json.Unmarshal(v, &s) == nil {
			out[k] = s
			continue
		}
		out[k] = string(bytes.TrimSpace(v))
	}
	*c = out
	return nil
}

// ConfigUpdate is a PUT of a VM's config.
type ConfigUpdate struct {
	// Set are the keys to set.
	Set map[string]string
	// Delete are the keys to remove.
	Delete []string
	// Digest of the config the update was computed from: the server
	// refuses it when someone changed the config in between.
	Digest string
}

// CloneParams are the clone call's parameters.
type CloneParams struct {
	NewID       int
	Name        string
	Description string
	// Target node, when it is not the template's.
	Target string
	// Full copies the disks instead of linking them to the template's.
	Full bool
}

// VMStatus is the part of /status/current the driver reads.
type VMStatus struct {
	Status    string `json:"status"`
	QMPStatus string `json:"qmpstatus"`
	Lock      string `json:"lock"`
	Agent     Bool   `json:"agent"`
}

// Interface is one network interface the guest agent reports.
type Interface struct {
	Name            string `json:"name"`
	HardwareAddress string `json:"hardware-address"`
	IPAddresses     []struct {
		Address string `json:"ip-address"`
		Type    string `json:"ip-address-type"`
		Prefix  int    `json:"prefix"`
	} `json:"ip-addresses"`
}

// Task is one entry of a node's task list. Status is empty while the task
// runs, then "OK" or the error it ended with.
type Task struct {
	UPID      string `json:"upid"`
	Node      string `json:"node"`
	Type      string `json:"type"`
	ID        string `json:"id"`
	User      string `json:"user"`
	Status    string `json:"status"`
	StartTime int64  `json:"starttime"`
	EndTime   int64  `json:"endtime"`
}

// Running reports whether the task has not ended.
func (t Task) Running() bool { return t.EndTime == 0 && t.Status == "" }

// Failed reports whether the task ended with an error.
func (t Task) Failed() bool { return !t.Running() && t.Status != "OK" }

// UPID is a parsed task ID:
// UPID:node:pid:pstart:starttime:type:id:user@realm[!token]:.
type UPID struct {
	Node      string
	StartTime int64
	Type      string
	ID        string
}

// ParseUPID parses a UPID; ok is false for anything else.
func ParseUPID(s string) (UPID, bool) {
	parts := strings.Split(s, ":")
	if len(parts) != 9 || parts[0] != "UPID" || parts[8] != "" || parts[1] == "" {
		return UPID{}, false
	}
	st, err := strconv.ParseInt(parts[4], 16, 64)
	if err != nil {
		return UPID{}, false
	}
	return UPID{Node: parts[1], StartTime: st, Type: parts[5], ID: parts[6]}, true
}
