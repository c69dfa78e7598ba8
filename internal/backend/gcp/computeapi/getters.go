package computeapi

// The getters are nil-safe: a field of a missing object reads as unset.

// GetName is x.Name, or its zero value when it is not set.
func (x *Instance) GetName() string {
	if x == nil || x.Name == nil {
		return ""
	}
	return *x.Name
}

// GetDescription is x.Description, or its zero value when it is not set.
func (x *Instance) GetDescription() string {
	if x == nil || x.Description == nil {
		return ""
	}
	return *x.Description
}

// GetMachineType is x.MachineType, or its zero value when it is not set.
func (x *Instance) GetMachineType() string {
	if x == nil || x.MachineType == nil {
		return ""
	}
	return *x.MachineType
}

// GetZone is x.Zone, or its zero value when it is not set.
func (x *Instance) GetZone() string {
	if x == nil || x.Zone == nil {
		return ""
	}
	return *x.Zone
}

// GetStatus is x.Status, or its zero value when it is not set.
func (x *Instance) GetStatus() string {
	if x == nil || x.Status == nil {
		return ""
	}
	return *x.Status
}

// GetCreationTimestamp is x.CreationTimestamp, or its zero value when it is not set.
func (x *Instance) GetCreationTimestamp() string {
	if x == nil || x.CreationTimestamp == nil {
		return ""
	}
	return *x.CreationTimestamp
}

// GetLastStartTimestamp is x.LastStartTimestamp, or its zero value when it is not set.
func (x *Instance) GetLastStartTimestamp() string {
	if x == nil || x.LastStartTimestamp == nil {
		return ""
	}
	return *x.LastStartTimestamp
}

// GetFingerprint is x.Fingerprint, or its zero value when it is not set.
func (x *Instance) GetFingerprint() string {
	if x == nil || x.Fingerprint == nil {
		return ""
	}
	return *x.Fingerprint
}

// GetLabels is x.Labels; nil for a nil x.
func (x *Instance) GetLabels() map[string]string {
	if x == nil {
		return nil
	}
	return x.Labels
}

// GetMetadata is x.Metadata; nil for a nil x.
func (x *Instance) GetMetadata() *Metadata {
	if x == nil {
		return nil
	}
	return x.Metadata
}

// GetNetworkInterfaces is x.NetworkInterfaces; nil for a nil x.
func (x *Instance) GetNetworkInterfaces() []*NetworkInterface {
	if x == nil {
		return nil
	}
	return x.NetworkInterfaces
}

// GetDisks is x.Disks; nil for a nil x.
func (x *Instance) GetDisks() []*AttachedDisk {
	if x == nil {
		return nil
	}
	return x.Disks
}

// GetTags is x.Tags; nil for a nil x.
func (x *Instance) GetTags() *Tags {
	if x == nil {
		return nil
	}
	return x.Tags
}

// GetFingerprint is x.Fingerprint, or its zero value when it is not set.
func (x *Metadata) GetFingerprint() string {
	if x == nil || x.Fingerprint == nil {
		return ""
	}
	return *x.Fingerprint
}

// GetItems is x.Items; nil for a nil x.
func (x *Metadata) GetItems() []*Items {
	if x == nil {
		return nil
	}
	return x.Items
}

// GetKey is x.Key, or its zero value when it is not set.
func (x *Items) GetKey() string {
	if x == nil || x.Key == nil {
		return ""
	}
	return *x.Key
}

// GetValue is x.Value, or its zero value when it is not set.
func (x *Items) GetValue() string {
	if x == nil || x.Value == nil {
		return ""
	}
	return *x.Value
}

// GetNetwork is x.Network, or its zero value when it is not set.
func (x *NetworkInterface) GetNetwork() string {
	if x == nil || x.Network == nil {
		return ""
	}
	return *x.Network
}

// GetSubnetwork is x.Subnetwork, or its zero value when it is not set.
func (x *NetworkInterface) GetSubnetwork() string {
	if x == nil || x.Subnetwork == nil {
		return ""
	}
	return *x.Subnetwork
}

// GetNetworkIP is x.NetworkIP, or its zero value when it is not set.
func (x *NetworkInterface) GetNetworkIP() string {
	if x == nil || x.NetworkIP == nil {
		return ""
	}
	return *x.NetworkIP
}

// GetAccessConfigs is x.AccessConfigs; nil for a nil x.
func (x *NetworkInterface) GetAccessConfigs() []*AccessConfig {
	if x == nil {
		return nil
	}
	return x.AccessConfigs
}

// GetName is x.Name, or its zero value when it is not set.
func (x *AccessConfig) GetName() string {
	if x == nil || x.Name == nil {
		return ""
	}
	return *x.Name
}

// GetType is x.Type, or its zero value when it is not set.
func (x *AccessConfig) GetType() string {
	if x == nil || x.Type == nil {
		return ""
	}
	return *x.Type
}

// GetNatIP is x.NatIP, or its zero value when it is not set.
func (x *AccessConfig) GetNatIP() string {
	if x == nil || x.NatIP == nil {
		return ""
	}
	return *x.NatIP
}

// GetFingerprint is x.Fingerprint, or its zero value when it is not set.
func (x *Tags) GetFingerprint() string {
	if x == nil || x.Fingerprint == nil {
		return ""
	}
	return *x.Fingerprint
}

// GetItems is x.Items; nil for a nil x.
func (x *Tags) GetItems() []string {
	if x == nil {
		return nil
	}
	return x.Items
}

// GetBoot is x.Boot, or its zero value when it is not set.
func (x *AttachedDisk) GetBoot() bool {
	if x == nil || x.Boot == nil {
		return false
	}
	return *x.Boot
}

// GetAutoDelete is x.AutoDelete, or its zero value when it is not set.
func (x *AttachedDisk) GetAutoDelete() bool {
	if x == nil || x.AutoDelete == nil {
		return false
	}
	return *x.AutoDelete
}

// GetInitializeParams is x.InitializeParams; nil for a nil x.
func (x *AttachedDisk) GetInitializeParams() *AttachedDiskInitializeParams {
	if x == nil {
		return nil
	}
	return x.InitializeParams
}

// GetSourceImage is x.SourceImage, or its zero value when it is not set.
func (x *AttachedDiskInitializeParams) GetSourceImage() string {
	if x == nil || x.SourceImage == nil {
		return ""
	}
	return *x.SourceImage
}

// GetDiskSizeGb is x.DiskSizeGb, or its zero value when it is not set.
func (x *AttachedDiskInitializeParams) GetDiskSizeGb() int64 {
	if x == nil || x.DiskSizeGb == nil {
		return 0
	}
	return *x.DiskSizeGb
}

// GetName is x.Name, or its zero value when it is not set.
func (x *Operation) GetName() string {
	if x == nil || x.Name == nil {
		return ""
	}
	return *x.Name
}

// GetZone is x.Zone, or its zero value when it is not set.
func (x *Operation) GetZone() string {
	if x == nil || x.Zone == nil {
		return ""
	}
	return *x.Zone
}

// GetRegion is x.Region, or its zero value when it is not set.
func (x *Operation) GetRegion() string {
	if x == nil || x.Region == nil {
		return ""
	}
	return *x.Region
}

// GetStatus is x.Status, or its zero value when it is not set.
func (x *Operation) GetStatus() string {
	if x == nil || x.Status == nil {
		return ""
	}
	return *x.Status
}

// GetOperationType is x.OperationType, or its zero value when it is not set.
func (x *Operation) GetOperationType() string {
	if x == nil || x.OperationType == nil {
		return ""
	}
	return *x.OperationType
}

// GetTargetLink is x.TargetLink, or its zero value when it is not set.
func (x *Operation) GetTargetLink() string {
	if x == nil || x.TargetLink == nil {
		return ""
	}
	return *x.TargetLink
}

// GetProgress is x.Progress, or its zero value when it is not set.
func (x *Operation) GetProgress() int32 {
	if x == nil || x.Progress == nil {
		return 0
	}
	return *x.Progress
}

// GetEndTime is x.EndTime, or its zero value when it is not set.
func (x *Operation) GetEndTime() string {
	if x == nil || x.EndTime == nil {
		return ""
	}
	return *x.EndTime
}

// GetHttpErrorStatusCode is x.HttpErrorStatusCode, or its zero value when it is not set.
func (x *Operation) GetHttpErrorStatusCode() int32 {
	if x == nil || x.HttpErrorStatusCode == nil {
		return 0
	}
	return *x.HttpErrorStatusCode
}

// GetError is x.Error; nil for a nil x.
func (x *Operation) GetError() *Error {
	if x == nil {
		return nil
	}
	return x.Error
}

// GetErrors is x.Errors; nil for a nil x.
func (x *Error) GetErrors() []*Errors {
	if x == nil {
		return nil
	}
	return x.Errors
}

// GetCode is x.Code, or its zero value when it is not set.
func (x *Errors) GetCode() string {
	if x == nil || x.Code == nil {
		return ""
	}
	return *x.Code
}

// GetMessage is x.Message, or its zero value when it is not set.
func (x *Errors) GetMessage() string {
	if x == nil || x.Message == nil {
		return ""
	}
	return *x.Message
}

// GetName is x.Name, or its zero value when it is not set.
func (x *Address) GetName() string {
	if x == nil || x.Name == nil {
		return ""
	}
	return *x.Name
}

// GetDescription is x.Description, or its zero value when it is not set.
func (x *Address) GetDescription() string {
	if x == nil || x.Description == nil {
		return ""
	}
	return *x.Description
}

// GetAddressType is x.AddressType, or its zero value when it is not set.
func (x *Address) GetAddressType() string {
	if x == nil || x.AddressType == nil {
		return ""
	}
	return *x.AddressType
}

// GetRegion is x.Region, or its zero value when it is not set.
func (x *Address) GetRegion() string {
	if x == nil || x.Region == nil {
		return ""
	}
	return *x.Region
}

// GetAddress is x.Address, or its zero value when it is not set.
func (x *Address) GetAddress() string {
	if x == nil || x.Address == nil {
		return ""
	}
	return *x.Address
}

// GetStatus is x.Status, or its zero value when it is not set.
func (x *Address) GetStatus() string {
	if x == nil || x.Status == nil {
		return ""
	}
	return *x.Status
}

// GetCreationTimestamp is x.CreationTimestamp, or its zero value when it is not set.
func (x *Address) GetCreationTimestamp() string {
	if x == nil || x.CreationTimestamp == nil {
		return ""
	}
	return *x.CreationTimestamp
}

// GetLabelFingerprint is x.LabelFingerprint, or its zero value when it is not set.
func (x *Address) GetLabelFingerprint() string {
	if x == nil || x.LabelFingerprint == nil {
		return ""
	}
	return *x.LabelFingerprint
}

// GetLabels is x.Labels; nil for a nil x.
func (x *Address) GetLabels() map[string]string {
	if x == nil {
		return nil
	}
	return x.Labels
}

// GetName is x.Name, or its zero value when it is not set.
func (x *Firewall) GetName() string {
	if x == nil || x.Name == nil {
		return ""
	}
	return *x.Name
}

// GetDescription is x.Description, or its zero value when it is not set.
func (x *Firewall) GetDescription() string {
	if x == nil || x.Description == nil {
		return ""
	}
	return *x.Description
}

// GetNetwork is x.Network, or its zero value when it is not set.
func (x *Firewall) GetNetwork() string {
	if x == nil || x.Network == nil {
		return ""
	}
	return *x.Network
}

// GetDirection is x.Direction, or its zero value when it is not set.
func (x *Firewall) GetDirection() string {
	if x == nil || x.Direction == nil {
		return ""
	}
	return *x.Direction
}

// GetPriority is x.Priority, or its zero value when it is not set.
func (x *Firewall) GetPriority() int32 {
	if x == nil || x.Priority == nil {
		return 0
	}
	return *x.Priority
}

// GetSourceRanges is x.SourceRanges; nil for a nil x.
func (x *Firewall) GetSourceRanges() []string {
	if x == nil {
		return nil
	}
	return x.SourceRanges
}

// GetTargetTags is x.TargetTags; nil for a nil x.
func (x *Firewall) GetTargetTags() []string {
	if x == nil {
		return nil
	}
	return x.TargetTags
}

// GetAllowed is x.Allowed; nil for a nil x.
func (x *Firewall) GetAllowed() []*Allowed {
	if x == nil {
		return nil
	}
	return x.Allowed
}

// GetDisabled is x.Disabled, or its zero value when it is not set.
func (x *Firewall) GetDisabled() bool {
	if x == nil || x.Disabled == nil {
		return false
	}
	return *x.Disabled
}

// GetCreationTimestamp is x.CreationTimestamp, or its zero value when it is not set.
func (x *Firewall) GetCreationTimestamp() string {
	if x == nil || x.CreationTimestamp == nil {
		return ""
	}
	return *x.CreationTimestamp
}

// GetIPProtocol is x.IPProtocol, or its zero value when it is not set.
func (x *Allowed) GetIPProtocol() string {
	if x == nil || x.IPProtocol == nil {
		return ""
	}
	return *x.IPProtocol
}

// GetPorts is x.Ports; nil for a nil x.
func (x *Allowed) GetPorts() []string {
	if x == nil {
		return nil
	}
	return x.Ports
}

// GetItems is x.Items; nil for a nil x.
func (x *FirewallList) GetItems() []*Firewall {
	if x == nil {
		return nil
	}
	return x.Items
}

// GetNextPageToken is x.NextPageToken, or its zero value when it is not set.
func (x *FirewallList) GetNextPageToken() string {
	if x == nil || x.NextPageToken == nil {
		return ""
	}
	return *x.NextPageToken
}

// GetQuotas is x.Quotas; nil for a nil x.
func (x *Region) GetQuotas() []*Quota {
	if x == nil {
		return nil
	}
	return x.Quotas
}

// GetMetric is x.Metric, or its zero value when it is not set.
func (x *Quota) GetMetric() string {
	if x == nil || x.Metric == nil {
		return ""
	}
	return *x.Metric
}

// GetLimit is x.Limit, or its zero value when it is not set.
func (x *Quota) GetLimit() float64 {
	if x == nil || x.Limit == nil {
		return 0
	}
	return *x.Limit
}

// GetUsage is x.Usage, or its zero value when it is not set.
func (x *Quota) GetUsage() float64 {
	if x == nil || x.Usage == nil {
		return 0
	}
	return *x.Usage
}

// GetVariableValue is x.VariableValue, or its zero value when it is not set.
func (x *GuestAttributes) GetVariableValue() string {
	if x == nil || x.VariableValue == nil {
		return ""
	}
	return *x.VariableValue
}

// GetCode is x.Code, or its zero value when it is not set.
func (x *Warning) GetCode() string {
	if x == nil || x.Code == nil {
		return ""
	}
	return *x.Code
}

// GetMessage is x.Message, or its zero value when it is not set.
func (x *Warning) GetMessage() string {
	if x == nil || x.Message == nil {
		return ""
	}
	return *x.Message
}

// GetItems is x.Items; nil for a nil x.
func (x *InstanceAggregatedList) GetItems() map[string]*InstancesScopedList {
	if x == nil {
		return nil
	}
	return x.Items
}

// GetNextPageToken is x.NextPageToken, or its zero value when it is not set.
func (x *InstanceAggregatedList) GetNextPageToken() string {
	if x == nil || x.NextPageToken == nil {
		return ""
	}
	return *x.NextPageToken
}

// GetUnreachables is x.Unreachables; nil for a nil x.
func (x *InstanceAggregatedList) GetUnreachables() []string {
	if x == nil {
		return nil
	}
	return x.Unreachables
}

// GetInstances is x.Instances; nil for a nil x.
func (x *InstancesScopedList) GetInstances() []*Instance {
	if x == nil {
		return nil
	}
	return x.Instances
}

// GetWarning is x.Warning; nil for a nil x.
func (x *InstancesScopedList) GetWarning() *Warning {
	if x == nil {
		return nil
	}
	return x.Warning
}

// GetItems is x.Items; nil for a nil x.
func (x *AddressAggregatedList) GetItems() map[string]*AddressesScopedList {
	if x == nil {
		return nil
	}
	return x.Items
}

// GetNextPageToken is x.NextPageToken, or its zero value when it is not set.
func (x *AddressAggregatedList) GetNextPageToken() string {
	if x == nil || x.NextPageToken == nil {
		return ""
	}
	return *x.NextPageToken
}

// GetUnreachables is x.Unreachables; nil for a nil x.
func (x *AddressAggregatedList) GetUnreachables() []string {
	if x == nil {
		return nil
	}
	return x.Unreachables
}

// GetAddresses is x.Addresses; nil for a nil x.
func (x *AddressesScopedList) GetAddresses() []*Address {
	if x == nil {
		return nil
	}
	return x.Addresses
}

// GetWarning is x.Warning; nil for a nil x.
func (x *AddressesScopedList) GetWarning() *Warning {
	if x == nil {
		return nil
	}
	return x.Warning
}
