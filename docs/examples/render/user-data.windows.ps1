<powershell>
# kiln node contract v1: writes C:\ProgramData\kiln\ and starts kiln-firstboot.
# Written by `kiln render`. cloudbase-init and EC2Launch both run this block.
$ErrorActionPreference = 'Stop'
$dir = 'C:\ProgramData\kiln'
New-Item -ItemType Directory -Force -Path $dir | Out-Null
# ProgramData lets Users add files: the kiln directory allows them to read only.
& icacls.exe $dir /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)(F)' '*S-1-5-32-544:(OI)(CI)(F)' '*S-1-5-32-545:(OI)(CI)(RX)' | Out-Null
if ($LASTEXITCODE -ne 0) { throw "icacls failed on $dir" }
function Write-KilnFile([string]$Name, [string]$Data, [bool]$Secret) {
  $path = Join-Path $dir $Name
  $tmp = "$path.tmp"
  [IO.File]::WriteAllBytes($tmp, [Convert]::FromBase64String($Data))
  if ($Secret) {
    # The Windows form of mode 0600: only LocalSystem and Administrators (by SID).
    & icacls.exe $tmp /inheritance:r /grant:r '*S-1-5-18:(F)' '*S-1-5-32-544:(F)' | Out-Null
    if ($LASTEXITCODE -ne 0) { throw "icacls failed on $tmp" }
  }
  Move-Item -Force -LiteralPath $tmp -Destination $path
}
Write-KilnFile 'node.env' 'IyBraWxuIG5vZGUgY29udHJhY3QgdjE6IHdyaXR0ZW4gYnkgYGtpbG4gcmVuZGVyYCBmcm9tIG5vZGUudG9tbC4KS0lMTl9DT05UUkFDVD0xCkFQSV9TRVJWRVI9aHR0cHM6Ly8xMC4wLjAuMTA6NjQ0MwpDTFVTVEVSX05BTUU9cHJvZC1ldTEKSk9JTl9NT0RFPWt1YmVsZXQKUFJPVklERVI9YXV0bwpOT0RFX0xBQkVMUz1ub2RlLmt1YmVybmV0ZXMuaW8vcm9sZT13b3JrZXIsdGllcj13ZWIKTk9ERV9UQUlOVFM9ZGVkaWNhdGVkPXdlYjpOb1NjaGVkdWxlCk1BWF9QT0RTPTU4CkNMVVNURVJfRE5TPTEwLjk2LjAuMTAKS1VCRUxFVF9FWFRSQV9BUkdTPS0tdj0yCktJTE5fREVBRExJTkU9NjAwCkhUVFBTX1BST1hZPWh0dHA6Ly9wcm94eS5pbnRlcm5hbDozMTI4Ck5PX1BST1hZPTEwLjAuMC4wLzgsLnN2YywuY2x1c3Rlci5sb2NhbCwxNjkuMjU0LjE2OS4yNTQK' $false
Write-KilnFile 'ca.crt' 'LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJmakNDQVNXZ0F3SUJBZ0lVUGIrelBUTzZuYkxUSFlSZVFtMlRNMi9pcjRzd0NnWUlLb1pJemowRUF3SXcKRlRFVE1CRUdBMVVFQXd3S2EzVmlaWEp1WlhSbGN6QWVGdzB5TmpFeE1qRXdOakEzTURaYUZ3MHpOakV4TVRndwpOakEzTURaYU1CVXhFekFSQmdOVkJBTU1DbXQxWW1WeWJtVjBaWE13V1RBVEJnY3Foa2pPUFFJQkJnZ3Foa2pPClBRTUJCd05DQUFTN2dxcFY1NkVIb3BpUERoNHAreXpweGZPRHk4aHBOY3BNd0pXbTU5TXNxR0FSTmVhZGdjaE4KbC80ZWN6UkJXMFhyMmZTc25RWVJqU2pLVlk2UXpicFBvMU13VVRBZEJnTlZIUTRFRmdRVXVNajdTb0pGSGR2NgpTWDA1dk5aVnUxMVBNQjB3SHdZRFZSMGpCQmd3Rm9BVXVNajdTb0pGSGR2NlNYMDV2TlpWdTExUE1CMHdEd1lEClZSMFRBUUgvQkFVd0F3RUIvekFLQmdncWhrak9QUVFEQWdOSEFEQkVBaUJEQk9OK0Vnak92TmQyTnRWRXd5YVcKZUVHb3p5anhzSVk1VjU3eDA1MS8wUUlnTXFWS3NKU2Naanp6bkp5YmNqR3l0dEk3anJKMEVVUW9Pc1Y3cHNIMgpWbUE9Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K' $false
Write-KilnFile 'bootstrap-token' 'MDc0MDFiLmYzOTVhY2NkMjQ2YWU1MmQK' $true
Write-KilnFile 'kubelet-dropin.conf' 'ewogICJhcGlWZXJzaW9uIjogImt1YmVsZXQuY29uZmlnLms4cy5pby92MWJldGExIiwKICAiZmVhdHVyZUdhdGVzIjogewogICAgIkltYWdlTWF4aW11bUdDQWdlIjogdHJ1ZQogIH0sCiAgImltYWdlR0NIaWdoVGhyZXNob2xkUGVyY2VudCI6IDkwLAogICJraW5kIjogIkt1YmVsZXRDb25maWd1cmF0aW9uIgp9Cg==' $false
New-Item -ItemType Directory -Force -Path (Join-Path $dir 'containerd\certs.d\docker.io') | Out-Null
Write-KilnFile 'containerd\certs.d\docker.io\ca.crt' 'LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJmakNDQVNXZ0F3SUJBZ0lVUGIrelBUTzZuYkxUSFlSZVFtMlRNMi9pcjRzd0NnWUlLb1pJemowRUF3SXcKRlRFVE1CRUdBMVVFQXd3S2EzVmlaWEp1WlhSbGN6QWVGdzB5TmpFeE1qRXdOakEzTURaYUZ3MHpOakV4TVRndwpOakEzTURaYU1CVXhFekFSQmdOVkJBTU1DbXQxWW1WeWJtVjBaWE13V1RBVEJnY3Foa2pPUFFJQkJnZ3Foa2pPClBRTUJCd05DQUFTN2dxcFY1NkVIb3BpUERoNHAreXpweGZPRHk4aHBOY3BNd0pXbTU5TXNxR0FSTmVhZGdjaE4KbC80ZWN6UkJXMFhyMmZTc25RWVJqU2pLVlk2UXpicFBvMU13VVRBZEJnTlZIUTRFRmdRVXVNajdTb0pGSGR2NgpTWDA1dk5aVnUxMVBNQjB3SHdZRFZSMGpCQmd3Rm9BVXVNajdTb0pGSGR2NlNYMDV2TlpWdTExUE1CMHdEd1lEClZSMFRBUUgvQkFVd0F3RUIvekFLQmdncWhrak9QUVFEQWdOSEFEQkVBaUJEQk9OK0Vnak92TmQyTnRWRXd5YVcKZUVHb3p5anhzSVk1VjU3eDA1MS8wUUlnTXFWS3NKU2Naanp6bkp5YmNqR3l0dEk3anJKMEVVUW9Pc1Y3cHNIMgpWbUE9Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K' $false
Write-KilnFile 'containerd\certs.d\docker.io\hosts.toml' 'IyBXcml0dGVuIGJ5IGtpbG4gcmVuZGVyIGZyb20gbm9kZS50b21sJ3MgW1tjb250YWluZXJkLnJlZ2lzdHJ5XV0gaG9zdCA9ICJkb2NrZXIuaW8iLgpzZXJ2ZXIgPSAiaHR0cHM6Ly9yZWdpc3RyeS0xLmRvY2tlci5pbyIKY2EgPSAiY2EuY3J0IgoKW2hvc3QuImh0dHBzOi8vbWlycm9yLmludGVybmFsOjUwMDAiXQogIGNhcGFiaWxpdGllcyA9IFsicHVsbCIsICJyZXNvbHZlIl0KICBjYSA9ICJjYS5jcnQiCg==' $false
if (Get-Service -Name 'kiln-firstboot' -ErrorAction SilentlyContinue) { Start-Service -Name 'kiln-firstboot' } else { & 'C:\k\kiln-firstboot.exe' run; exit $LASTEXITCODE }
</powershell>
