package gcptest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The fake's token endpoints, as Google's OAuth 2.0 token server and the
// IAM Service Account Credentials API answer them:
//
//	POST /token    a service-account key's signed JWT (grant_type
//	               urn:ietf:params:oauth:grant-type:jwt-bearer) for an
//	               access token; the signature is checked with the key
//	               ServiceAccountKey made
//	POST /v1/projects/-/serviceAccounts/{email}:generateAccessToken
//	               an access token of {email} for the caller's, when the
//	               caller (and each delegate in turn) holds the token
//	               creator role on the next (AllowImpersonation)
//
// With RequireAuth, Compute calls without a token the fake issued are
// refused with 401, and Principal says whose token a call carried.

// iam is the fake's identity state, under Server.mu.
type iam struct {
	keys     map[string]*rsa.PublicKey // service account -> its key
	creators map[string][]string       // service account -> who may mint its tokens
	tokens   map[string]string         // access token -> service account
	require  bool
	n        int
}

func (s *Server) iamState() *iam {
	if s.identity == nil {
		s.identity = &iam{keys: map[string]*rsa.PublicKey{}, creators: map[string][]string{}, tokens: map[string]string{}}
	}
	return s.identity
}

// ServiceAccountKey makes a key for the service account email, as the IAM
// console downloads it (JSON, PKCS#8 private key), whose token_uri is the
// fake's /token.
func (s *Server) ServiceAccountKey(email string) []byte {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		panic(err)
	}
	s.mu.Lock()
	s.iamState().keys[email] = &k.PublicKey
	s.mu.Unlock()
	b, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": s.Project, "private_key_id": fmt.Sprintf("%x", sha256.Sum256(der))[:40],
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": email, "client_id": "1000000000000000000" + fmt.Sprint(len(email)),
		"auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": s.URL + "/token",
		"auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
	})
	return b
}

// AllowImpersonation grants caller roles/iam.serviceAccountTokenCreator on
// the service account target.
func (s *Server) AllowImpersonation(caller, target string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.iamState()
	st.creators[target] = append(st.creators[target], caller)
}

// RequireAuth makes Compute calls need a token the fake issued.
func (s *Server) RequireAuth() {
	s.do(func() { s.iamState().require = true })
}

// Principal is the service account whose token the Authorization header
// carries, or "" when the fake did not issue it.
func (s *Server) Principal(authorization string) string {
	return read(s, func() string { return s.iamState().tokens[strings.TrimPrefix(authorization, "Bearer ")] })
}

// authorized reports whether a Compute call may go on; under s.mu.
func (s *Server) authorized(r *http.Request) bool {
	st := s.iamState()
	return !st.require || st.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")] != ""
}

func (s *Server) mint(principal string) string {
	st := s.iamState()
	st.n++
	tok := fmt.Sprintf("ya29.fake-%d", st.n)
	st.tokens[tok] = principal
	return tok
}

// serveIdentity answers the token endpoints; false when r is for neither.
func (s *Server) serveIdentity(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case r.URL.Path == "/token" && r.Method == http.MethodPost:
		s.serveToken(w, r)
	case strings.HasPrefix(r.URL.Path, "/v1/projects/-/serviceAccounts/") && strings.HasSuffix(r.URL.Path, ":generateAccessToken") && r.Method == http.MethodPost:
		s.serveGenerateAccessToken(w, r)
	default:
		return false
	}
	return true
}

func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}

func (s *Server) serveToken(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+r.PostForm.Get("grant_type"))
		return
	}
	parts := strings.Split(r.PostForm.Get("assertion"), ".")
	if len(parts) != 3 {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe")
		return
	}
	var claims struct {
		Iss   string `json:"iss"`
		Aud   string `json:"aud"`
		Scope string `json:"scope"`
		Exp   int64  `json:"exp"`
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err == nil {
		err = json.Unmarshal(payload, &claims)
	}
	if err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT payload")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	pub := s.iamState().keys[claims.Iss]
	sig, serr := base64.RawURLEncoding.DecodeString(parts[2])
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	switch {
	case pub == nil:
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid grant: account not found")
	case serr != nil || rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig) != nil:
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT Signature.")
	case claims.Aud != s.URL+"/token" || claims.Exp < time.Now().Unix() || claims.Scope == "":
		oauthError(w, http.StatusBadRequest, "invalid_grant", "Invalid JWT: audience, expiry or scope")
	default:
		writeJSON(w, http.StatusOK, map[string]any{"access_token": s.mint(claims.Iss), "expires_in": 3599, "token_type": "Bearer"})
	}
}

func iamDenied(w http.ResponseWriter) {
	writeJSON(w, http.StatusForbidden, map[string]any{"error": map[string]any{
		"code": 403, "message": "Permission 'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist).", "status": "PERMISSION_DENIED",
		"details": []any{map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "IAM_PERMISSION_DENIED", "domain": "iam.googleapis.com",
			"metadata": map[string]any{"permission": "iam.serviceAccounts.getAccessToken"}}},
	}})
}

func (s *Server) serveGenerateAccessToken(w http.ResponseWriter, r *http.Request) {
	target := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/projects/-/serviceAccounts/"), ":generateAccessToken")
	var body struct {
		Delegates []string `json:"delegates"`
		Scope     []string `json:"scope"`
		Lifetime  string   `json:"lifetime"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Scope) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{"code": 400, "message": "Request contains an invalid argument.", "status": "INVALID_ARGUMENT"}})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.iamState()
	caller := st.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	if caller == "" {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]any{"code": 401, "message": "Request had invalid authentication credentials.", "status": "UNAUTHENTICATED"}})
		return
	}
	chain := []string{caller}
	for _, d := range body.Delegates {
		chain = append(chain, strings.TrimPrefix(d, "projects/-/serviceAccounts/"))
	}
	chain = append(chain, target)
	for i := 1; i < len(chain); i++ {
		if !slices.Contains(st.creators[chain[i]], chain[i-1]) {
			iamDenied(w)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"accessToken": s.mint(target), "expireTime": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
}
