// Package computeapi is the part of Compute Engine's v1 REST API the gcp
// driver uses, as Go types of its JSON wire format: exactly the resources
// and fields the driver reads or writes, with Compute's lowerCamel names.
// Fields a response has and a type does not name are ignored, except on an
// instance and its parts, which keep them (see Instance) so that an
// instance read and written back (instances.update) loses nothing.
//
// Optional scalars are pointers, so that an explicit false, 0 or "" (a
// firewall rule's disabled: false) is sent and an unset one is not; the
// getters are nil-safe. int64 and uint64 fields are JSON strings, as on
// Compute's wire.
package computeapi

// OperationDone is the status of a finished operation; the others are
// PENDING and RUNNING.
const OperationDone = "DONE"

// Instance is a VM instance (compute#instance).
//
// It keeps the members it does not name, as read, and sends them back
// when encoded: instances.update replaces the instance with its body,
// so a member left out would be reset.
type Instance struct {
	Name               *string             `json:"name,omitempty"`
	Description        *string             `json:"description,omitempty"`
	MachineType        *string             `json:"machineType,omitempty"`
	Zone               *string             `json:"zone,omitempty"`
	Status             *string             `json:"status,omitempty"`
	CreationTimestamp  *string             `json:"creationTimestamp,omitempty"`
	LastStartTimestamp *string             `json:"lastStartTimestamp,omitempty"`
	Fingerprint        *string             `json:"fingerprint,omitempty"`
	Labels             map[string]string   `json:"labels,omitempty"`
	Metadata           *Metadata           `json:"metadata,omitempty"`
	NetworkInterfaces  []*NetworkInterface `json:"networkInterfaces,omitempty"`
	Disks              []*AttachedDisk     `json:"disks,omitempty"`
	Tags               *Tags               `json:"tags,omitempty"`

	rest members
}

// Metadata is an instance's metadata: key/value items and the
// fingerprint an update must carry.
type Metadata struct {
	Fingerprint *string  `json:"fingerprint,omitempty"`
	Items       []*Items `json:"items,omitempty"`

	rest members
}

// Items is one metadata entry.
type Items struct {
	Key   *string `json:"key,omitempty"`
	Value *string `json:"value,omitempty"`
}

// NetworkInterface is one of an instance's network interfaces.
type NetworkInterface struct {
	Network       *string         `json:"network,omitempty"`
	Subnetwork    *string         `json:"subnetwork,omitempty"`
	NetworkIP     *string         `json:"networkIP,omitempty"`
	AccessConfigs []*AccessConfig `json:"accessConfigs,omitempty"`

	rest members
}

// AccessConfig is an external NAT of a network interface.
type AccessConfig struct {
	Name  *string `json:"name,omitempty"`
	Type  *string `json:"type,omitempty"`
	NatIP *string `json:"natIP,omitempty"`

	rest members
}

// Tags are an instance's network tags.
type Tags struct {
	Fingerprint *string  `json:"fingerprint,omitempty"`
	Items       []string `json:"items,omitempty"`

	rest members
}

// AttachedDisk is a disk of an instance; InitializeParams creates it with
// the instance.
type AttachedDisk struct {
	Boot             *bool                         `json:"boot,omitempty"`
	AutoDelete       *bool                         `json:"autoDelete,omitempty"`
	InitializeParams *AttachedDiskInitializeParams `json:"initializeParams,omitempty"`

	rest members
}

// AttachedDiskInitializeParams say what a new disk is made from.
type AttachedDiskInitializeParams struct {
	SourceImage *string `json:"sourceImage,omitempty"`
	DiskSizeGb  *int64  `json:"diskSizeGb,omitempty,string"`
}

// Operation is a zonal, regional or global operation (compute#operation).
type Operation struct {
	Name                *string `json:"name,omitempty"`
	Zone                *string `json:"zone,omitempty"`
	Region              *string `json:"region,omitempty"`
	Status              *string `json:"status,omitempty"`
	OperationType       *string `json:"operationType,omitempty"`
	TargetLink          *string `json:"targetLink,omitempty"`
	Progress            *int32  `json:"progress,omitempty"`
	EndTime             *string `json:"endTime,omitempty"`
	HttpErrorStatusCode *int32  `json:"httpErrorStatusCode,omitempty"`
	Error               *Error  `json:"error,omitempty"`
}

// Error is the error of a failed operation.
type Error struct {
	Errors []*Errors `json:"errors,omitempty"`
}

// Errors is one error of a failed operation.
type Errors struct {
	Code    *string `json:"code,omitempty"`
	Message *string `json:"message,omitempty"`
}

// Address is a reserved IP address (compute#address).
type Address struct {
	Name              *string           `json:"name,omitempty"`
	Description       *string           `json:"description,omitempty"`
	AddressType       *string           `json:"addressType,omitempty"`
	Region            *string           `json:"region,omitempty"`
	Address           *string           `json:"address,omitempty"`
	Status            *string           `json:"status,omitempty"`
	CreationTimestamp *string           `json:"creationTimestamp,omitempty"`
	LabelFingerprint  *string           `json:"labelFingerprint,omitempty"`
	Labels            map[string]string `json:"labels,omitempty"`
}

// RegionSetLabelsRequest is the body of addresses.setLabels: the labels
// replace the address's, all of them (an empty map is sent as {}).
type RegionSetLabelsRequest struct {
	LabelFingerprint *string           `json:"labelFingerprint,omitempty"`
	Labels           map[string]string `json:"labels"`
}

// Firewall is a VPC firewall rule (compute#firewall).
type Firewall struct {
	Name              *string    `json:"name,omitempty"`
	Description       *string    `json:"description,omitempty"`
	Network           *string    `json:"network,omitempty"`
	Direction         *string    `json:"direction,omitempty"`
	Priority          *int32     `json:"priority,omitempty"`
	SourceRanges      []string   `json:"sourceRanges,omitempty"`
	TargetTags        []string   `json:"targetTags,omitempty"`
	Allowed           []*Allowed `json:"allowed,omitempty"`
	Disabled          *bool      `json:"disabled,omitempty"`
	CreationTimestamp *string    `json:"creationTimestamp,omitempty"`
}

// Allowed is a protocol and its ports a firewall rule admits.
type Allowed struct {
	IPProtocol *string  `json:"IPProtocol,omitempty"`
	Ports      []string `json:"ports,omitempty"`
}

// FirewallList is one page of firewalls.list.
type FirewallList struct {
	Items         []*Firewall `json:"items,omitempty"`
	NextPageToken *string     `json:"nextPageToken,omitempty"`
}

// Region is a region (compute#region), read for its quotas.
type Region struct {
	Quotas []*Quota `json:"quotas,omitempty"`
}

// Quota is one quota of a region.
type Quota struct {
	Metric *string  `json:"metric,omitempty"`
	Limit  *float64 `json:"limit,omitempty"`
	Usage  *float64 `json:"usage,omitempty"`
}

// GuestAttributes is the answer of instances.getGuestAttributes for one
// variableKey.
type GuestAttributes struct {
	VariableValue *string `json:"variableValue,omitempty"`
}

// Warning is a scoped list's warning (NO_RESULTS_ON_PAGE for a zone
// without instances, UNREACHABLE).
type Warning struct {
	Code    *string `json:"code,omitempty"`
	Message *string `json:"message,omitempty"`
}

// InstanceAggregatedList is one page of instances.aggregatedList: the
// instances by scope (zones/<zone>), and the scopes that did not answer.
type InstanceAggregatedList struct {
	Items         map[string]*InstancesScopedList `json:"items,omitempty"`
	NextPageToken *string                         `json:"nextPageToken,omitempty"`
	Unreachables  []string                        `json:"unreachables,omitempty"`
}

// InstancesScopedList is the instances of one scope.
type InstancesScopedList struct {
	Instances []*Instance `json:"instances,omitempty"`
	Warning   *Warning    `json:"warning,omitempty"`
}

// AddressAggregatedList is one page of addresses.aggregatedList.
type AddressAggregatedList struct {
	Items         map[string]*AddressesScopedList `json:"items,omitempty"`
	NextPageToken *string                         `json:"nextPageToken,omitempty"`
	Unreachables  []string                        `json:"unreachables,omitempty"`
}

// AddressesScopedList is the addresses of one scope.
type AddressesScopedList struct {
	Addresses []*Address `json:"addresses,omitempty"`
	Warning   *Warning   `json:"warning,omitempty"`
}
